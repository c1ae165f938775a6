"""A job's state: which objects are done (resume), its description, the failure report, dead
letters.

OUTPUT holds only `.out` files, as a SageMaker output prefix does; everything else goes to the
job's state location (`--state-dir`, default `<OUTPUT>.tfservo-state` beside it). An object
is done when its .out exists (sinks only ever publish complete ones), so a rerun of the same
command skips it. `job.json` records what decides the outputs' bytes (the bundle, its
versions, the flags that shape them): a rerun with other settings stops instead of keeping
outputs they would not give. Records skipped with --on-record-error skip go to
`deadletters/<name>.deadletter.jsonl`, written before the .out. State that an earlier tfservo
left inside OUTPUT (`_tfservo_job.json`, …) is read once and moved out.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from tfservo.batch.job import JobError, TransformJob
from tfservo.batch.sinks import OutputStore
from tfservo.batch.sources import InputObject
from tfservo.models.bundle import Bundle
from tfservo.storage.urls import display_url, is_local, url_to_fs

__all__ = [
    "DEAD_LETTERS",
    "DEAD_LETTER_SUFFIX",
    "JOB_NAME",
    "REPORT_NAME",
    "bundle_versions",
    "check_settings",
    "dead_letter_name",
    "DeadLetter",
    "job_description",
    "ObjectOutcome",
    "open_output",
    "pending_objects",
    "RecordFailure",
    "setting_changes",
    "TransformSummary",
    "write_report",
]

log = logging.getLogger("tfservo.batch")

REPORT_NAME = "failures.json"
JOB_NAME = "job.json"
DEAD_LETTERS = "deadletters/"
DEAD_LETTER_SUFFIX = ".deadletter.jsonl"
# Where tfservo before the state location kept these, inside OUTPUT.
LEGACY_JOB_NAME, LEGACY_REPORT_NAME = "_tfservo_job.json", "_tfservo_failures.json"


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
        doc: dict[str, object] = {"object": obj.rel, "input": obj.url, "where": self.where, "record": self.index}
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
    workers: list[str] = field(default_factory=list)  # host:pid of each worker that took part (Ray, Spark)

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
            f"on {len(self.workers)} worker{'s' if len(self.workers) != 1 else ''} ({', '.join(self.workers)})"
            if self.workers else None,
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
    """The object's dead letters, in the state location."""
    return DEAD_LETTERS + obj.rel + DEAD_LETTER_SUFFIX


def write_report(store: OutputStore, job: TransformJob, summary: TransformSummary) -> str | None:
    """Write the failure report into the state location (`store`) when anything failed or was
    dead-lettered, else remove a stale one; returns where it is."""
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


# -- the job's description, and OUTPUT made ready for a run --------------------------------------


def bundle_versions(bundles: Iterable[Bundle]) -> dict[str, list[int]]:
    """Each model of the bundles → its version numbers, as the job's description records them."""
    return {name: sorted(source.versions) for bundle in bundles for name, source in bundle.models.items()}


def job_description(job: TransformJob, versions: dict[str, list[int]] | None = None) -> dict[str, object]:
    """What decides the bytes of the job's outputs: the bundle, its models' versions (None: not
    known yet, and then not compared) and the flags that shape the outputs."""
    fs, path = url_to_fs(job.model)
    model = display_url(fs, os.path.realpath(path) if is_local(fs) else path.rstrip("/"))
    doc: dict[str, object] = {"model": model, "flags": job.output_flags()}
    if versions is not None:
        doc["versions"] = versions
    return doc


def setting_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """How `current` differs from the `recorded` description, one phrase per difference."""
    changes = []
    if recorded.get("model") != current["model"]:
        changes.append(f"MODEL was {recorded.get('model')}, now {current['model']}")
    if "versions" in recorded and "versions" in current and recorded["versions"] != current["versions"]:
        changes.append(f"the bundle's versions were {_versions(recorded)}, now {_versions(current)}")
    old, new = recorded.get("flags", {}), current["flags"]
    names = [*new, *(name for name in old if name not in new)]
    if old.get("--on-record-error") == "fail":  # such outputs hold no placeholders: skip mode may resume them
        names = [name for name in names if name not in ("--on-record-error", "--placeholder")]
    for name in names:
        if old.get(name) != new.get(name):
            changes.append(f"{name} was {_shown(old.get(name))}, now {_shown(new.get(name))}")
    return changes


def check_settings(
    state: OutputStore, job: TransformJob, current: dict[str, object]
) -> tuple[dict[str, object] | None, list[str]]:
    """(the recorded description or None, what `current` changes); JobError when the outputs
    in OUTPUT were made with other settings and --overwrite is not given. A description an
    earlier tfservo left inside OUTPUT counts too."""
    source, name = state, JOB_NAME
    try:
        raw = state.get(JOB_NAME)
    except FileNotFoundError:
        source, name = OutputStore(job.output), LEGACY_JOB_NAME
        try:
            raw = source.get(LEGACY_JOB_NAME)
        except FileNotFoundError:
            return None, []
    try:
        recorded = orjson.loads(raw)
        problem = None if isinstance(recorded, dict) else "is not a JSON object"
    except orjson.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc})"
    if problem is not None:
        if job.overwrite:
            return None, []
        raise JobError(
            f"{source.display(name)} {problem}; it records the settings the outputs in {job.output} "
            "were made with. Use --overwrite to redo every object, or another OUTPUT"
        )
    changes = setting_changes(recorded, current)
    if changes and not job.overwrite:
        raise JobError(
            f"OUTPUT {job.output} holds outputs made with other settings ({source.display(name)}): "
            f"{'; '.join(changes)}. Resuming would keep them: add --overwrite to redo every object "
            "with these settings, or write to another OUTPUT"
        )
    return recorded, changes


def open_output(
    store: OutputStore,
    state: OutputStore,
    job: TransformJob,
    objects: list[InputObject],
    versions: dict[str, list[int]] | None,
) -> tuple[set[str], list[InputObject], list[InputObject]]:
    """Make OUTPUT (`store`) and the state location (`state`) ready for a run, before anything
    is written: check and record the job's description, abort a killed run's uploads, remove
    its partial files, move state an earlier tfservo left in OUTPUT. Returns (names in the
    state location, objects to do, objects already done); every engine starts here."""
    current = job_description(job, versions)
    recorded, changes = check_settings(state, job, current)
    outputs = {o.out_name for o in objects}
    letters = {dead_letter_name(o) for o in objects}
    for where, names in ((store, outputs), (state, letters | {REPORT_NAME, JOB_NAME})):
        try:
            where.abort_uploads(names)
        except OSError as exc:
            log.warning(
                "could not look for unfinished uploads of interrupted runs under %s (%s: %s); any "
                "there cost storage until aborted (aws s3api list-multipart-uploads)",
                where.url, type(exc).__name__, exc,
            )
    try:
        existing = store.existing()
        in_state = state.existing()
    except OSError as exc:
        raise JobError(f"cannot list OUTPUT {job.output} or its state {job.state_url}: {type(exc).__name__}: {exc}") from None
    in_state |= _move_legacy_state(store, state, objects, existing)
    earlier = outputs & existing if job.overwrite and (recorded is None or changes) else set()
    if earlier:  # made with other (or unknown) settings: none may outlive this run
        log.info("--overwrite with settings other than those in %s (or none recorded): removing the %d "
                 "earlier outputs of these objects first", state.display(JOB_NAME), len(earlier))
        store.remove_all(earlier)
        state.remove_all(letters & in_state)
        existing -= earlier
        in_state -= letters
    # versions not known here (an engine given only an invoker) stay as recorded
    described = {**recorded, **current} if recorded and not changes else current
    if described != recorded or JOB_NAME not in in_state:  # new, changed, or moved out of OUTPUT
        state.put(JOB_NAME, orjson.dumps(described, option=orjson.OPT_INDENT_2) + b"\n")
        in_state.add(JOB_NAME)
    cleaned = store.clean_partials() + state.clean_partials()
    if cleaned:
        log.info("removed %d partial outputs left by an interrupted run", cleaned)
    todo, done = pending_objects(objects, existing, job.overwrite)
    if done:
        log.info(
            "resuming: %d of %d objects already have their .out in %s and are skipped "
            "(--overwrite redoes them)", len(done), len(objects), job.output,
        )
    return in_state, todo, done


def _move_legacy_state(
    store: OutputStore, state: OutputStore, objects: list[InputObject], existing: set[str]
) -> set[str]:
    """State an earlier tfservo kept inside OUTPUT, moved to the state location (dead letters)
    or dropped (description, report: rewritten by this run); returns the names it moved."""
    moved: set[str] = set()
    for obj in objects:
        old = obj.rel + DEAD_LETTER_SUFFIX
        if old in existing:
            state.put(dead_letter_name(obj), store.get(old))
            store.remove(old)
            existing.discard(old)
            moved.add(dead_letter_name(obj))
    for old in (LEGACY_JOB_NAME, LEGACY_REPORT_NAME):
        if old in existing:
            store.remove(old)
            existing.discard(old)
    if moved:
        log.info("moved %d dead-letter files from OUTPUT to %s", len(moved), state.display(DEAD_LETTERS))
    return moved


def _shown(value: object) -> str:
    return "unset" if value is None else orjson.dumps(value).decode()


def _versions(doc: dict[str, Any]) -> str:
    models = doc["versions"].items()
    return "; ".join(f"{name} {', '.join(map(str, versions))}" for name, versions in models) or "none"
