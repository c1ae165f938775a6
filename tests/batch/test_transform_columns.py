"""Plain CSV records as Arrow columns (batch.columnar) against the per-record path, on a real
model: the same output bytes, dead letters and failures for any mix of plain and unusual lines.

Each case runs the local engine twice on the same input, with columns and without; blocks are
made small so that requests span blocks and a block that is not plain sits between plain ones.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transform_jobs import HALF_PLUS_THREE, INSURANCE, hp3, report, tree, write  # noqa: F401

from tfservo.batch import records
from tfservo.batch.columnar import ColumnBatch, column_batches
from tfservo.batch.engines.local import TransformEngine
from tfservo.batch.job import TransformJob
from tfservo.batch.joiner import DataProcessing
from tfservo.batch.jsonpath import parse_jsonpath
from tfservo.batch.records import blank_test, line_chunk, pack_batches

# Lines the per-record path treats each its own way; the columns must decline or agree.
PLAIN = st.builds(lambda i, v: f"Q{i:04d},{v}", st.integers(0, 9999), st.sampled_from(["1", "2.5", "-0.125", "1e3", "007"]))
ODD = st.sampled_from([
    "", "  ", "Q1", "Q1,2,3", 'Q1,"2.5"', '"Q,1",2', "Q1,abc", "Q1,", "Q1,2\r", "\ufeffQ1,2", "Q1,\xe9",
])
FLAGS = [
    INSURANCE,
    {**INSURANCE, "output_filter": None},
    {**INSURANCE, "output_filter": "$[-1]", "join_source": "None"},
    {**INSURANCE, "output_filter": "$[1]", "accept": "text/csv"},
    {**INSURANCE, "input_filter": "$[-1]", "output_filter": "$[5:]"},
    {**INSURANCE, "output_filter": "$[0,3]"},
    {**INSURANCE, "join_source": "None", "output_filter": None, "accept": "text/csv"},
    {**INSURANCE, "join_source": "None", "output_filter": None},
]


class Recording:
    """The real invoker, keeping each request body."""

    def __init__(self, invoker):
        self.invoker = invoker
        self.bodies: list[bytes] = []

    def call(self, body, *args, **kwargs):
        self.bodies.append(body)
        return self.invoker.call(body, *args, **kwargs)

    def invoke(self, body, *args, **kwargs):
        self.bodies.append(body)
        return self.invoker.invoke(body, *args, **kwargs)


def run(service, source, out, columns, **flags):
    job = TransformJob(str(HALF_PLUS_THREE), str(source), str(out), on_record_error="skip", **flags)
    summary = TransformEngine(job, service.invoker, progress="none", columns=columns).run()
    return summary.records, [o.obj.rel for o in summary.failed]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.one_of(PLAIN, PLAIN, PLAIN, ODD), min_size=1, max_size=60),
    flags=st.sampled_from(FLAGS),
    payload=st.sampled_from([6, 0.0002, 0.00005]),
    block=st.sampled_from([64, 256, 1 << 20]),
    last_newline=st.booleans(),
)
def test_columns_write_what_the_per_record_path_writes(hp3, tmp_path_factory, monkeypatch, lines, flags, payload, block, last_newline):
    monkeypatch.setattr(records, "CHUNK_BYTES", block)
    root = tmp_path_factory.mktemp("case")
    text = "\n".join(lines) + ("\n" if last_newline else "")
    write(root / "in" / "quotes.csv", text.encode("utf-8", errors="surrogateescape"))
    flags = {k: v for k, v in flags.items() if v is not None}
    rows = run(hp3, root / "in", root / "rows", False, max_payload_mb=payload, **flags)
    columns = run(hp3, root / "in", root / "cols", True, max_payload_mb=payload, **flags)
    assert columns == rows
    assert tree(root / "cols") == tree(root / "rows")
    assert report(root / "cols") == report(root / "rows")


def test_insurance_lines_travel_as_columns_in_requests_packed_as_before(hp3, tmp_path, monkeypatch):
    """Plain lines go as columns, in the requests the per-record packing makes, across blocks."""
    monkeypatch.setattr(records, "CHUNK_BYTES", 4096)
    quotes = "".join(f"Q{i:06d},{i % 97}.25\n" for i in range(5000))
    write(tmp_path / "in" / "quotes.csv", quotes)
    bodies: dict[bool, list[bytes]] = {}
    for columns in (False, True):
        recording = Recording(hp3.invoker)
        job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / f"out-{columns}"),
                           max_payload_mb=0.002, **INSURANCE)
        assert TransformEngine(job, recording, progress="none", columns=columns).run().ok
        bodies[columns] = recording.bodies
    assert sorted(bodies[True]) == sorted(bodies[False]) and len(bodies[True]) > 5
    assert (tmp_path / "out-True" / "quotes.csv.out").read_bytes() == (tmp_path / "out-False" / "quotes.csv.out").read_bytes()
    first = (tmp_path / "out-True" / "quotes.csv.out").read_bytes().split(b"\n")[:2]
    assert first == [b"Q000000,3.125", b"Q000001," + orjson.dumps(1.25 / 2 + 3)]


def test_plain_blocks_become_columns_and_the_rest_after_an_odd_block_records_in_order():
    """Plain blocks go as columns; from the first block that is not plain on, the object goes
    per record, the request being gathered included, so every request holds what it would hold
    without columns (its verdict, when it fails, depends on what it holds)."""
    processing = DataProcessing("csv", parse_jsonpath("$[1:]"), parse_jsonpath("$[0,-1]"), True)
    blocks = [(1, b"a,1\nb,2\n"), (3, b"d,4\ne,5\nf,6\n"), (6, b"c,3\n\n"), (8, b"g,7")]

    def pack(chunks):
        return pack_batches(chunks, split_type="Line", batch_strategy="MultiRecord", max_bytes=6, name="x")

    batches = list(column_batches(blocks, processing, max_bytes=6, pack_rows=pack))
    assert [(type(b).__name__, b.first, len(b), b.body()) for b in batches] == [
        ("ColumnBatch", 1, 3, b"1\n2\n4\n"), ("RecordBatch", 4, 4, b"5\n6\n3\n"), ("RecordBatch", 8, 1, b"7"),
    ]
    rows_only = list(pack((line_chunk(i, text), *processing.prepare_many(line_chunk(i, text).data, blank_test("Line")))
                          for i, text in blocks))
    assert [b.body() for b in batches] == [b.body() for b in rows_only]  # the same requests
    rows = batches[0].rows(processing)
    assert (rows.first, rows.data, rows.payloads) == (1, [b"a,1", b"b,2", b"d,4"], [b"1", b"2", b"4"])
    assert batches[0].record(2).data == b"d,4"
    # what Ray, Spark and Beam carry between processes: plain tuples, the columns as Arrow IPC bytes
    wired = ColumnBatch.unwire(batches[0].wire())
    assert (wired.first, wired.payload, wired.nbytes, wired.body()) == (1, [1], batches[0].nbytes, b"1\n2\n4\n")
    # packed across blocks, by the per-record rule: a request ends before the body passes 6 bytes
    across = list(column_batches([(1, b"a,1\nb,2\n"), (3, b"c,3\nd,4\n")], processing, max_bytes=6, pack_rows=pack))
    assert [(b.first, b.body(), b.nbytes) for b in across] == [(1, b"1\n2\n3\n", 12), (4, b"4\n", 4)]


# "Q3,4,5": a row with an extra column disagrees with its mini-batch, which /invocations refuses
# whole; it fails as a record (it used to be answered alone).
@pytest.mark.parametrize(("bad", "failed"), [("Q3,oops", ["line 3"]), ("Q3", ["line 3"]), ('Q3,"4"', ["line 3"]),
                                             ("Q3,4,5", ["line 3"])])
def test_an_odd_line_among_plain_ones_goes_as_on_the_per_record_path(hp3, tmp_path, bad, failed):
    write(tmp_path / "in" / "quotes.csv", "Q1,1\nQ2,2\n" + bad + "\nQ4,4\n")
    failures = {}
    for columns in (False, True):
        job = TransformJob(str(HALF_PLUS_THREE), str(tmp_path / "in"), str(tmp_path / f"out-{columns}"), **INSURANCE)
        summary = TransformEngine(job, hp3.invoker, progress="none", columns=columns).run()
        failures[columns] = [(o.failure.where, o.failure.error) for o in summary.failed]
    assert failures[True] == failures[False]
    assert [where for where, _ in failures[True]] == failed
