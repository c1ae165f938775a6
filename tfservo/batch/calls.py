"""One request for a batch of records, through the invocation path, back to output pieces.

The answer stays arrays (Invoker.call): when every record's answer is plain numbers, the
batch's output lines are cut straight from them and filters and join run over the whole
batch at once. Otherwise — and for any batch that fails, or whose answer cannot be split per
record — the records are taken one at a time, so an error names the record that caused it
and, with --on-record-error skip, only that record is replaced by a placeholder and
dead-lettered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import orjson

from tfservo.batch.assemble import (
    RecordOutput,
    SplitError,
    assemble_piece,
    split_response,
    whole_response,
)
from tfservo.batch.capture import request_capture
from tfservo.batch.columnar import ColumnBatch, finish_columns
from tfservo.batch.job import TransformJob
from tfservo.batch.joiner import DataProcessing, FilterError
from tfservo.batch.records import Item, RecordBatch, excerpt, payload, where
from tfservo.batch.state import DeadLetter, RecordFailure
from tfservo.codecs.media_types import record_kind
from tfservo.codecs.rows import answer_rows
from tfservo.core import tracing
from tfservo.core.batch_split import Failed, NotTried, inputs_structure, is_transient, run_split
from tfservo.core.errors import Code, ServingError
from tfservo.core.logs import reported_by_caller
from tfservo.core.retry import Backoff
from tfservo.core.status import http_status
from tfservo.models.calls import Answer, PredictCall
from tfservo.service.invocation import InvocationResult, Invoker, result_error

__all__ = ["BatchCaller", "BatchResult"]

log = logging.getLogger("tfservo.batch")


@dataclass
class BatchResult:
    """What one batch adds to its object's output, in order."""

    pieces: list[bytes] = field(default_factory=list)
    records: int = 0
    dead: list[DeadLetter] = field(default_factory=list)
    failure: RecordFailure | None = None  # --on-record-error fail: the first record that failed
    capture: list[bytes] = field(default_factory=list)  # --data-capture: a line per answered request


class _RecordFailed(ServingError):
    """A request of the batch that failed: the message as a record's error, the code its answer's."""

    def __init__(self, message: str, code: Code = Code.INTERNAL) -> None:
        super().__init__(message, code)


_TRANSIENT_RETRIES = Backoff(retries=3, base_delay=0.2, max_delay=2.0)  # an overloaded model's batch, whole


def _record_message(error: BaseException) -> str:
    """A failed record's error as its failure report and dead letter word it."""
    if isinstance(error, _RecordFailed):
        return error.message
    if isinstance(error, ServingError):
        return f"the model answered {http_status(error.code)}: {error.message}"
    return f"{type(error).__name__}: {error}"


class BatchCaller:
    """Sends batches of one object's records to `invoker` and turns answers into output pieces."""

    def __init__(
        self, invoker: Invoker, job: TransformJob, processing: DataProcessing, content_type: str, rel: str = "",
    ) -> None:
        self.invoker = invoker
        self.rel = rel  # the object's name in INPUT (capture's inference ids)
        self.job = job
        self.processing = processing
        self.content_type = content_type
        self.per_record = job.per_record
        self.line_end = b"\n" if job.assemble_with == "Line" else b""
        self.placeholder = job.placeholder.encode()

    def run(self, batch: RecordBatch | ColumnBatch) -> BatchResult:
        """Transform one batch (a span under the current trace); never raises for bad records or
        model errors."""
        with tracing.span("request", {"tfservo.transform.object": self.rel, "tfservo.transform.records": len(batch),
                                      "tfservo.transform.first_record": batch.first}):
            if isinstance(batch, ColumnBatch):
                columns = self._columns(batch)
                # what failed as columns fails the batch call the same way: straight to per record
                return columns if columns is not None else self.run_items(batch.rows(self.processing).items())
            if self.per_record and not batch.errors and self.job.split_type != "None":
                fast = self._fast(batch)
                if fast is not None:
                    return fast
            return self.run_items(batch.items())

    def _fast(self, batch: RecordBatch) -> BatchResult | None:
        """The batch's output from a plain-number answer in a few list operations; None when a
        record needs the per-record path (which also words every error)."""
        sent = batch.sent()
        if not sent:
            return None

        def finish(answer: Answer, kind: str) -> bytes | None:
            rows = answer_rows(answer)
            if rows is None or len(rows) != len(sent):
                return None
            lines = self.processing.finish_rows([batch.data[i] for i in sent], rows.json, rows.csv, kind)
            if lines is None:
                return None
            end = self.line_end
            if len(sent) == len(batch):
                return end.join(lines) + end if end else b"".join(lines)
            pieces = [end] * len(batch)
            for i, line in zip(sent, lines):
                pieces[i] = line + end
            return b"".join(pieces)

        return self._whole(batch.body(), batch.first + sent[0], len(batch), finish)

    def _columns(self, batch: ColumnBatch) -> BatchResult | None:
        """`_fast` for records as columns."""
        return self._whole(batch.body(), batch.first, len(batch),
                           lambda answer, kind: finish_columns(self.processing, batch, answer, kind, self.line_end))

    def _whole(self, body: bytes, first: int, records: int, finish: Callable[[Answer, str], bytes | None]) -> BatchResult | None:
        """A batch in one request, its output written by `finish` from an answer left as arrays in
        a CSV or JSON type; None for any failure (the per-record path then words it)."""
        sent_at = time.time()
        try:
            result = self.invoker.call(body, self.content_type, self.job.accept, self.job.custom_attributes)
        except Exception:
            return None
        kind = record_kind(result.content_type)
        if not result.ok or result.answer is None or kind is None:
            return None
        out = finish(result.answer, kind)
        if out is None:
            return None
        done = BatchResult([out], records)
        self._capture(done, body, result, sent_at, first)
        return done

    def run_items(self, batch: list[Item]) -> BatchResult:
        """Transform one batch a record at a time where need be; never raises for bad records."""
        sent = [item for item in batch if item.payload is not None]
        answers: dict[int, RecordOutput | bytes | str] = {}
        result = BatchResult()
        if sent:
            answers = self._call(sent, result)
        for item in batch:
            if item.error is not None:
                answer: RecordOutput | bytes | str | None = item.error
            elif item.payload is None:
                answer = None  # a blank line: kept as a blank line, never sent
            else:
                answer = answers.get(id(item))
                if answer is None:
                    break  # not tried: an earlier record failed the object
            if not self._add(result, item, answer):
                break
        return result

    def _add(self, result: BatchResult, item: Item, answer: RecordOutput | bytes | str | None) -> bool:
        record = item.record
        if answer is None:
            if self.per_record:
                result.pieces.append(self.line_end)
            result.records += 1
            return True
        if isinstance(answer, RecordOutput):
            try:
                answer = self.processing.finish(record.data, answer) + self.line_end
            except FilterError as exc:
                answer = str(exc)
        if isinstance(answer, str):
            split = self.job.split_type
            if self.job.on_record_error == "fail":
                result.failure = RecordFailure(where(record, split), answer, excerpt(record.data))
                return False
            result.dead.append(DeadLetter(where(record, split), record.index, record.data, answer))
            piece = self.placeholder + self.line_end if self.per_record else assemble_piece(self.placeholder, self.job.assemble_with)
            result.pieces.append(piece)
        else:
            result.pieces.append(answer)
        result.records += 1
        return True

    def _call(self, sent: list[Item], into: BatchResult) -> dict[int, RecordOutput | bytes | str]:
        """Per sent item: its output (RecordOutput per record, bytes per request) or an error;
        each answered request's capture line goes `into` the batch's result. A failed request
        splits by core.batch_split's rule (records that disagree with the rest fail, the rest
        are retried); an overload or outage is retried whole with back-off, then fails every
        record it held."""

        def run(group: Sequence[Item]) -> list[RecordOutput | bytes | str]:
            answers = self._try(list(group), into)
            return [answers[id(item)] for item in group]

        try:
            outcomes = _TRANSIENT_RETRIES.call(
                lambda: run_split(sent, run, structure=self._structure, stop_at_first=self.job.on_record_error == "fail"),
                retriable=is_transient,
            )
        except ServingError as exc:  # transient, still: no record's fault, but none answered
            return {id(item): _record_message(exc) for item in sent}
        answers: dict[int, RecordOutput | bytes | str] = {}
        for item, outcome in zip(sent, outcomes):
            if isinstance(outcome, Failed):
                answers[id(item)] = _record_message(outcome.error)
            elif not isinstance(outcome, NotTried):
                answers[id(item)] = outcome
        if len(sent) > 1 and any(isinstance(outcome, Failed) for outcome in outcomes):
            log.debug("a batch of %d records failed; its records were split by the batch rule", len(sent))
        return answers

    def _structure(self, item: Item) -> Hashable:
        """What a record's request decodes to — input names, dtypes, inner shapes — for telling
        the records that disagree with their batch; one constant with handlers (their code
        decodes: each record is then tried alone)."""
        body = payload([item], self.job.split_type)
        prepared = self.invoker.prepare(body, self.content_type, self.job.accept, self.job.custom_attributes)
        if prepared is None:
            return "-"
        prepared.handle.release()
        call = prepared.call
        if not isinstance(call, PredictCall):
            return call.method
        return inputs_structure(call.inputs)

    def _try(self, sent: list[Item], into: BatchResult) -> dict[int, RecordOutput | bytes | str]:
        body = payload(sent, self.job.split_type)
        sent_at = time.time()
        try:
            with reported_by_caller():  # a failed record gets one FAILED line, not one per retry
                result = self.invoker.invoke(body, self.content_type, self.job.accept, self.job.custom_attributes)
        except Exception as exc:  # a bug below us must fail records, not the run
            log.debug("invocation raised", exc_info=True)
            raise _RecordFailed(f"the invocation raised {type(exc).__name__}: {exc}") from None
        if not result.ok:
            text = result.error.message if result.error is not None else _error_text(result.body)
            raise _RecordFailed(f"the model answered {result.status}: {text}", result_error(result, "the model").code)
        self._capture(into, body, result, sent_at, sent[0].record.index)
        whole = self.job.split_type == "None"  # the record is the object: its output is the whole answer
        rows = answer_rows(result.answer) if self.per_record and not whole and result.answer is not None else None
        kind = record_kind(result.content_type)
        if rows is not None and kind is not None and len(rows) == len(sent):
            lines = rows.json if kind == "json" else rows.csv
            if kind == "csv":
                return {id(item): RecordOutput(line, kind) for item, line in zip(sent, lines)}
            return {id(item): RecordOutput(line, kind, orjson.loads(line)) for item, line in zip(sent, lines)}
        if not self.per_record:
            if len(sent) == 1:
                return {id(sent[0]): assemble_piece(result.body, self.job.assemble_with)}
            # one body for the whole request: it belongs to the batch, carried by its first record
            out: dict[int, RecordOutput | bytes | str] = {id(item): b"" for item in sent}
            out[id(sent[0])] = assemble_piece(result.body, self.job.assemble_with)
            return out
        if whole:
            return {id(sent[0]): whole_response(result.body)}
        try:
            outputs = split_response(result.body, result.content_type, len(sent))
        except SplitError as exc:
            raise _RecordFailed(f"{exc} (content type {result.content_type})") from None
        return {id(item): output for item, output in zip(sent, outputs)}


    def _capture(self, into: BatchResult, body: bytes, result: InvocationResult, sent_at: float, first: int) -> None:
        if self.job.data_capture is not None:
            into.capture.append(request_capture(
                self.job, body, self.content_type, result.body, result.content_type, sent_at, first, self.rel
            ))


def _error_text(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return excerpt(body, 400)
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, str):
        return error
    return excerpt(body, 400)
