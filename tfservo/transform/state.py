"""Job state kept in OUTPUT: which objects are done (resume), the failure report, dead letters.

An object is done when its .out exists (sinks only ever publish complete ones), so a rerun
of the same command skips it. Records skipped with --on-record-error skip go to
`<name>.deadletter.jsonl` beside the .out, written before it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from tfservo.transform.job import TransformJob
from tfservo.transform.sinks import OutputStore
from tfservo.transform.sources import InputObject

REPORT_NAME = "_tfservo_failures.json"
DEAD_LETTER_SUFFIX = ".deadletter.jsonl"


@dataclass(frozen=True)
class RecordFailure:
    """Why one record (or a whole object, when `where` says so) could not be transformed."""

    where: str  # "line 7", "record 3 (byte 120)", "the object"
    error: str
    record: str | None = None  # an excerpt of the record, when there is one


@dataclass(frozen=True)
class DeadLetter:
    """A record skipped with --on-record-error skip: where it was, its bytes, the error."""

    where: str
    index: int
    data: bytes
    error: str

    def to_json(self, obj: InputObject) -> bytes:
        doc: dict[str, Any] = {"object": obj.rel, "input": obj.url, "where": self.where, "record": self.index}
        try:
            doc["data"] = self.data.decode("utf-8")
        except UnicodeDecodeError:
            doc["data_base64"] = base64.b64encode(self.data).decode()
        doc["error"] = self.error
        return orjson.dumps(doc) + b"\n"


@dataclass
class ObjectOutcome:
    """How one object ended: done, skipped (already done), or failed."""

    obj: InputObject
    status: str  # "done", "skipped", "failed"
    records: int = 0
    failure: RecordFailure | None = None
    dead_letters: int = 0


@dataclass
class TransformSummary:
    """What a run did, for the summary line, the report and the exit code."""

    objects: int = 0
    done: int = 0
    skipped: int = 0
    failed: list[ObjectOutcome] = field(default_factory=list)
    dead_lettered: list[ObjectOutcome] = field(default_factory=list)
    records: int = 0
    seconds: float = 0.0
    report: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failed

    def add(self, outcome: ObjectOutcome) -> None:
        """Count one object's outcome (both engines report through here)."""
        if outcome.status == "done":
            self.done += 1
            self.records += outcome.records
            if outcome.dead_letters:
                self.dead_lettered.append(outcome)
        else:
            self.failed.append(outcome)

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        dead = sum(o.dead_letters for o in self.dead_lettered)
        parts = [
            f"{self.done} of {self.objects} objects transformed",
            f"{self.skipped} already done" if self.skipped else None,
            f"{len(self.failed)} failed" if self.failed else None,
            f"{self.records} records in {self.seconds:.1f}s ({rate:.1f} records/s)",
            f"{dead} records dead-lettered" if dead else None,
        ]
        return "; ".join(p for p in parts if p)


def pending_objects(
    objects: Iterable[InputObject], existing: set[str], overwrite: bool
) -> tuple[list[InputObject], list[InputObject]]:
    """(to do, already done): objects whose .out is in `existing` are done unless `overwrite`."""
    objects = list(objects)
    if overwrite:
        return objects, []
    todo = [o for o in objects if o.out_name not in existing]
    done = [o for o in objects if o.out_name in existing]
    return todo, done


def dead_letter_name(obj: InputObject) -> str:
    return obj.rel + DEAD_LETTER_SUFFIX


def write_report(store: OutputStore, job: TransformJob, summary: TransformSummary) -> str | None:
    """Write the failure report into OUTPUT when anything failed or was dead-lettered, else
    remove a stale one; returns where it is."""
    if not summary.failed and not summary.dead_lettered:
        store.remove(REPORT_NAME)
        return None
    doc = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "summary": summary.line(),
        "failed_objects": [
            {
                "object": o.obj.rel,
                "input": o.obj.url,
                "where": o.failure.where if o.failure else None,
                "record": o.failure.record if o.failure else None,
                "error": o.failure.error if o.failure else None,
            }
            for o in summary.failed
        ],
        "dead_letters": [
            {"object": o.obj.rel, "records": o.dead_letters, "file": store.display(dead_letter_name(o.obj))}
            for o in summary.dead_lettered
        ],
        "job": {k: v for k, v in asdict(job).items() if k != "env"} | {"env": sorted(job.env)},
    }
    store.put(REPORT_NAME, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    return store.display(REPORT_NAME)
