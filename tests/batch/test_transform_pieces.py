"""The transform engine's pure pieces: JSONPath, record splitting and packing, response
splitting, filters and join, job validation, atomic local outputs, retries."""

from __future__ import annotations

import gzip
import io
import os
import struct

import orjson
import pytest

from tfservo.batch.assemble import SplitError, split_response
from tfservo.batch.job import JobError, TransformJob, parse_env
from tfservo.batch.joiner import DataProcessing, FilterError
from tfservo.batch.jsonpath import JsonPathError, parse_jsonpath
from tfservo.batch.records import (
    RECORDIO_MAGIC,
    Item,
    RecordError,
    iter_records,
    pack,
    payload,
)
from tfservo.batch.sinks import OutputStore
from tfservo.batch.sources import guess_content_type
from tfservo.storage.retry import RetryingReader, retry, storage_error_is_transient

# -- JSONPath ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("$", [1, 2, 3], [1, 2, 3]),
        ("$[1:]", ["id", "a", "b"], ["a", "b"]),
        ("$[0,-1]", ["id", "a", "b", "p"], ["id", "p"]),
        ("$[-1]", ["id", "a", "p"], "p"),
        ("$[:2]", [1, 2, 3], [1, 2]),
        ("$[1:-1]", [1, 2, 3, 4], [2, 3]),
        ("$[0,2:]", [1, 2, 3, 4], [1, 3, 4]),
        ("$.features", {"id": 1, "features": [1.0, 2.0]}, [1.0, 2.0]),
        ("$.a.b[0]", {"a": {"b": [7, 8]}}, 7),
        ("$['a']", {"a": 1, "b": 2}, 1),
        ("$['id','SageMakerOutput']", {"id": 1, "x": 2, "SageMakerOutput": 3}, {"id": 1, "SageMakerOutput": 3}),
        ('$["id", "x"]', {"id": 1, "x": 2}, {"id": 1, "x": 2}),
        ("$.*", {"a": 1, "b": 2}, [1, 2]),
        ("$[*].x", [{"x": 1}, {"x": 2}], [1, 2]),
        ("$[0,1][0]", [[1, 2], [3, 4]], [1, 3]),
    ],
)
def test_jsonpath_selects_like_sagemaker(path, value, expected):
    assert parse_jsonpath(path).select(value) == expected


@pytest.mark.parametrize("text", ["features", "$.", "$[", "$[a]", "$[1:2:3]", "$['a','b'].c", "$x", "$[1,]"])
def test_jsonpath_syntax_errors_name_the_expression(text):
    with pytest.raises(JsonPathError) as info:
        parse_jsonpath(text)
    assert repr(text) in str(info.value)


def test_jsonpath_missing_parts_say_what_the_record_has():
    with pytest.raises(JsonPathError, match=r"no key 'features' \(keys: 'id', 'x'\)"):
        parse_jsonpath("$.features").select({"id": 1, "x": 2})
    with pytest.raises(JsonPathError, match="index 5 is outside the record, which has 2 fields"):
        parse_jsonpath("$[0,5]").select(["a", "b"])
    with pytest.raises(JsonPathError, match="needs an object, found an array"):
        parse_jsonpath("$.a").select([1])


# -- records ----------------------------------------------------------------------------------


def test_line_records_keep_line_numbers_blank_lines_and_crlf():
    records = list(iter_records(io.BytesIO(b"a,1\r\n\nb,2\nc,3"), "Line", "x.csv"))
    assert [(r.index, r.data, r.blank) for r in records] == [
        (1, b"a,1", False), (2, b"", True), (3, b"b,2", False), (4, b"c,3", False),
    ]
    assert records[2].offset == 6


def recordio_frame(data: bytes) -> bytes:
    return struct.pack("<II", RECORDIO_MAGIC, len(data)) + data + b"\0" * (-len(data) % 4)


def test_tfrecord_records_keep_their_framing_and_check_crcs(tmp_path):
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(tmp_path / "x.tfrecord")) as writer:  # TF's own writer
        for data in (b"one", b"", b"three"):
            writer.write(data)
    stream = (tmp_path / "x.tfrecord").read_bytes()
    records = list(iter_records(io.BytesIO(stream), "TFRecord", "x.tfrecord"))
    assert [r.data for r in records] == [b"one", b"", b"three"]
    assert b"".join(r.framed for r in records) == stream
    corrupt = bytearray(stream)
    corrupt[14] ^= 0xFF  # a byte of the first record's data
    with pytest.raises(RecordError, match="x.tfrecord: TFRecord record 1 at byte 0 fails its data checksum"):
        list(iter_records(io.BytesIO(bytes(corrupt)), "TFRecord", "x.tfrecord"))
    with pytest.raises(RecordError, match="truncated"):
        list(iter_records(io.BytesIO(stream[:-3]), "TFRecord", "x.tfrecord"))
    with pytest.raises(RecordError, match="is not a TFRecord file"):
        list(iter_records(io.BytesIO(b"id,value\n1,2\n3,4\n"), "TFRecord", "x.csv"))


def test_recordio_records_join_multipart_records_and_keep_framing():
    magic = struct.pack("<I", RECORDIO_MAGIC)

    def part(cflag: int, data: bytes) -> bytes:
        return struct.pack("<II", RECORDIO_MAGIC, (cflag << 29) | len(data)) + data + b"\0" * (-len(data) % 4)

    split_record = part(1, b"ab") + part(2, b"cde") + part(3, b"f")
    stream = recordio_frame(b"first") + split_record + recordio_frame(b"last!")
    records = list(iter_records(io.BytesIO(stream), "RecordIO", "x.rec"))
    assert [r.data for r in records] == [b"first", b"ab" + magic + b"cde" + magic + b"f", b"last!"]
    assert [r.offset for r in records] == [0, 16, 16 + len(split_record)]
    assert b"".join(r.framed for r in records) == stream
    with pytest.raises(RecordError, match="no RecordIO magic number at byte 0"):
        list(iter_records(io.BytesIO(b"not recordio at all"), "RecordIO", "x.rec"))


def _items(*payloads: bytes | None) -> list[Item]:
    records = list(iter_records(io.BytesIO(b"\n".join(p or b"" for p in payloads)), "Line", "x"))
    return [Item(r, p) for r, p in zip(records, payloads)]


def test_multirecord_packs_up_to_the_payload_limit_singlerecord_one_each():
    items = _items(b"aaaa", b"bbbb", None, b"cccc", b"dddd")
    batches = list(pack(items, split_type="Line", batch_strategy="MultiRecord", max_bytes=10, name="x"))
    assert [[i.record.index for i in b] for b in batches] == [[1, 2, 3], [4, 5]]
    # each record keeps its own line ending, as SageMaker frames MultiRecord requests
    assert [payload(b, "Line") for b in batches] == [b"aaaa\nbbbb\n", b"cccc\ndddd"]
    singles = list(pack(items, split_type="Line", batch_strategy="SingleRecord", max_bytes=10, name="x"))
    assert [[i.record.index for i in b] for b in singles] == [[1], [2, 3], [4], [5]]


def test_a_record_over_the_payload_limit_names_itself():
    items = _items(b"ok", b"x" * 100)
    with pytest.raises(RecordError) as info:
        list(pack(items, split_type="Line", batch_strategy="MultiRecord", max_bytes=50, name="data/a.csv"))
    assert "data/a.csv: line 2 is" in info.value.message and "over --max-payload" in info.value.message
    assert info.value.where == "line 2"


# -- splitting answers per record ---------------------------------------------------------------


def test_split_json_predictions_per_record():
    outputs = split_response(b'{"predictions": [3.5, [1, 2], {"a": 1}]}', "application/json", 3)
    assert [o.line for o in outputs] == [b"3.5", b"[1,2]", b'{"a":1}']
    columnar = split_response(b'{"outputs": {"y": [1.0, 2.0], "z": [3, 4]}}', "application/json", 2)
    assert [o.value for o in columnar] == [{"y": 1.0, "z": 3}, {"y": 2.0, "z": 4}]
    one = split_response(b'{\n  "label": "cat"\n}', "application/json", 1)
    assert one[0].line == b'{"label":"cat"}'
    with pytest.raises(SplitError, match="holds 2 predictions for 3 records"):
        split_response(b'{"predictions": [1, 2]}', "application/json", 3)


def test_split_csv_and_json_lines_per_record():
    assert [o.line for o in split_response(b"3.5\n4.0,1\n", "text/csv", 2)] == [b"3.5", b"4.0,1"]
    quoted = split_response(b'"a\nb",1\n2,3\n', "text/csv", 2)
    assert [o.line for o in quoted] == [b'"a\nb",1', b"2,3"]
    lines = split_response(b'{"p": 1}\n{"p": 2}\n', "application/jsonlines", 2)
    assert [o.value for o in lines] == [{"p": 1}, {"p": 2}]
    with pytest.raises(SplitError, match="cannot be split per record"):
        split_response(b"\x89PNG", "image/png", 2)
    assert split_response(b"\x89PNG", "image/png", 1)[0].line == b"\x89PNG"


# -- filters and join -------------------------------------------------------------------------


def test_csv_insurance_pattern_filters_and_join_keep_the_id_text():
    processing = DataProcessing("csv", parse_jsonpath("$[1:]"), parse_jsonpath("$[0,-1]"), True)
    assert processing.prepare(b"0007,1.5,x") == b"1.5,x"
    (out,) = split_response(b'{"predictions": [3.75]}', "application/json", 1)
    assert processing.finish(b"0007,1.5,x", out) == b"0007,3.75"
    (row,) = split_response(b"0.1,0.9\n", "text/csv", 1)
    whole = DataProcessing("csv", None, None, True)
    assert whole.finish(b'"a, b",2', row) == b'"a, b",2,0.1,0.9'


def test_json_join_adds_sagemaker_output_or_wraps_non_objects():
    processing = DataProcessing("json", parse_jsonpath("$.features"), None, True)
    assert processing.prepare(b'{"id": 1, "features": [1.0, 2.0]}') == b"[1.0,2.0]"
    (out,) = split_response(b'{"predictions": [[3.5, 4.0]]}', "application/json", 1)
    joined = processing.finish(b'{"id": 1, "features": [1.0, 2.0]}', out)
    assert orjson.loads(joined) == {"id": 1, "features": [1.0, 2.0], "SageMakerOutput": [3.5, 4.0]}
    assert orjson.loads(DataProcessing("json", None, None, True).finish(b"[1, 2]", out)) == {
        "SageMakerInput": [1, 2], "SageMakerOutput": [3.5, 4.0],
    }
    filtered = DataProcessing("json", None, parse_jsonpath("$['id','SageMakerOutput']"), True)
    assert orjson.loads(filtered.finish(b'{"id": 9, "x": 1}', out)) == {"id": 9, "SageMakerOutput": [3.5, 4.0]}


def test_filter_errors_are_per_record():
    processing = DataProcessing("json", parse_jsonpath("$.features"), None, False)
    with pytest.raises(FilterError, match="--input-filter \\$.features: the record has no key 'features'"):
        processing.prepare(b'{"id": 1}')
    with pytest.raises(FilterError, match="not valid JSON"):
        processing.prepare(b"id,1")


# -- the job ----------------------------------------------------------------------------------


def test_job_canonicalizes_choices_and_rejects_combinations_that_cannot_work():
    job = TransformJob("m", "in", "out", split_type="line", assemble_with="LINE", join_source="input").validated()
    assert (job.split_type, job.assemble_with, job.join_source) == ("Line", "Line", "Input")
    assert job.per_record
    with pytest.raises(JobError, match="add --assemble-with Line"):
        TransformJob("m", "in", "out", split_type="Line", join_source="Input").validated()
    with pytest.raises(JobError, match="cannot be used with --split-type TFRecord"):
        TransformJob("m", "in", "out", split_type="TFRecord", input_filter="$[1:]").validated()
    with pytest.raises(JobError, match="--content-type is image/jpeg"):
        TransformJob("m", "in", "out", content_type="image/jpeg", input_filter="$[1:]").validated()
    with pytest.raises(JobError, match="--split-type 'Lines' is not one of None, Line, RecordIO, TFRecord"):
        TransformJob("m", "in", "out", split_type="Lines").validated()
    with pytest.raises(JobError, match="--max-payload 0 must be more than 0 MB"):
        TransformJob("m", "in", "out", max_payload_mb=0).validated()
    with pytest.raises(JobError, match="--output-filter: '\\$\\[0,': '\\[' at position 1 is never closed"):
        TransformJob("m", "in", "out", output_filter="$[0,").validated()
    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(JobError, match="is not KEY=VALUE"):
        parse_env(["NOPE"])


def test_content_types_are_guessed_from_names():
    assert guess_content_type("a/b.csv", "None") == "text/csv"
    assert guess_content_type("b.csv.gz", "Gzip") == "text/csv"
    assert guess_content_type("img/cat.JPG", "None") == "image/jpeg"
    assert guess_content_type("x.jsonl", "None") == "application/jsonlines"
    assert guess_content_type("blob", "None") == "application/octet-stream"


# -- outputs ----------------------------------------------------------------------------------


def test_local_outputs_appear_only_on_commit_and_never_under_a_dot_out_name(tmp_path):
    store = OutputStore(str(tmp_path / "out"))
    writer = store.writer("a/b.csv.out")
    writer.write(b"1\n")
    visible = sorted(p.name for p in (tmp_path / "out" / "a").iterdir())
    assert len(visible) == 1 and visible[0].startswith(".") and not visible[0].endswith(".out")
    writer.write(b"2\n")
    writer.commit()
    assert (tmp_path / "out" / "a" / "b.csv.out").read_bytes() == b"1\n2\n"
    aborted = store.writer("c.out")
    aborted.write(b"x")
    aborted.abort()
    assert store.existing() == {"a/b.csv.out"}


def test_partials_of_dead_processes_are_cleaned_up(tmp_path):
    (tmp_path / ".a.csv.out.tfservo-partial-999999999-1").write_bytes(b"half")
    (tmp_path / "keep.out").write_bytes(b"x")
    assert OutputStore(str(tmp_path)).clean_partials() == 1
    assert sorted(os.listdir(tmp_path)) == ["keep.out"]


# -- retries ----------------------------------------------------------------------------------


def test_transient_errors_are_retried_and_permanent_ones_are_not():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("connection reset by peer")
        return "ok"

    assert retry(flaky, "test", base_delay=0.001) == "ok" and len(calls) == 3
    assert not storage_error_is_transient(FileNotFoundError("gone")) and not storage_error_is_transient(PermissionError())
    assert storage_error_is_transient(TimeoutError()) and storage_error_is_transient(OSError("s3 said 503"))
    with pytest.raises(FileNotFoundError):
        retry(lambda: open("/nonexistent/x"), "test", base_delay=0.001)


class _DroppingStream(io.BytesIO):
    """A stream whose connection drops once after `fail_at` bytes (as a network read can)."""

    dropped = False

    def __init__(self, data: bytes, fail_at: int) -> None:
        super().__init__(data)
        self.fail_at = fail_at

    def read(self, n=-1):
        if not _DroppingStream.dropped and self.tell() >= self.fail_at:
            _DroppingStream.dropped = True
            raise ConnectionResetError("connection dropped")
        return super().read(min(n, 1000) if n and n > 0 else 1000)


def test_a_read_interrupted_mid_object_resumes_at_the_same_byte():
    data = gzip.compress(b"".join(b"%d,%d\n" % (i, i * i) for i in range(5000)))

    def opener(offset: int):
        stream = _DroppingStream(data, fail_at=3000)
        stream.seek(offset)
        return stream

    reader = io.BufferedReader(RetryingReader(opener, "test object", base_delay=0.001))
    lines = list(gzip.GzipFile(fileobj=reader))
    assert _DroppingStream.dropped
    assert len(lines) == 5000 and lines[4999] == b"4999,24990001\n"


# -- progress ---------------------------------------------------------------------------------


def test_progress_logs_plain_lines_off_a_terminal(caplog):
    import logging
    import time

    from tfservo.batch.progress import Progress

    caplog.set_level(logging.INFO, logger="tfservo.batch")
    progress = Progress(4, 1000, mode="auto", interval=0.05, stream=io.StringIO())
    assert progress.mode == "log"
    progress.add(objects=1, records=120, nbytes=250)
    time.sleep(0.3)
    progress.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress: ")]
    assert lines and lines[-1].startswith("progress: 1/4 objects, 120 records, ")
    assert "records/s, ETA 0:00:0" in lines[-1]  # a quarter of the bytes in well under a second
