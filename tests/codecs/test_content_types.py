"""Content conversion: the container's json/jsonlines/csv → TF Serving request, and responses."""

from __future__ import annotations

import json

import orjson
import pytest

from tfservo.codecs.content_types import (
    MediaType,
    csv_records,
    from_tfs_response,
    negotiate,
    parse_accept,
    parse_content_type,
    parse_media_types,
    response_records,
    to_tfs_request,
)
from tfservo.codecs.json_arrays import NumericTensor
from tfservo.core.errors import Code, InvalidArgument, NotAcceptable, UnsupportedMediaType
from tfservo.core.status import error_status
from tfservo.service.custom_attributes import parse_custom_attributes

JSON = "application/json"


def instances(body: str | bytes, content_type: str = JSON) -> list:
    raw = body.encode() if isinstance(body, str) else body
    request = to_tfs_request(raw, content_type)
    assert isinstance(request, dict), request
    assert list(request) == ["instances"]
    found = request["instances"]
    if isinstance(found, NumericTensor):  # read as one array: it must hold what the general reading gives
        assert found.values.tolist() == found.as_json()
        return found.as_json()
    return found


# -- media types ------------------------------------------------------------------------------


def test_media_type_parses_params_and_charset():
    mt = MediaType.parse('Application/JSON; charset="UTF-8"; foo=bar')
    assert (mt.type, mt.subtype, mt.essence) == ("application", "json", JSON)
    assert mt.charset == "UTF-8"
    assert mt.params == {"charset": "UTF-8", "foo": "bar"}
    assert mt.q == 1.0


def test_media_type_rejects_non_types():
    for bad in ("json", "application/", "/json", "a/b/c", ""):
        with pytest.raises(ValueError):
            MediaType.parse(bad)


def test_media_type_wildcards_match():
    assert MediaType.parse("*/*").matches("text/csv")
    assert MediaType.parse("text/*").matches("text/csv")
    assert not MediaType.parse("text/*").matches(JSON)
    assert MediaType.parse("*").essence == "*/*"


def test_parse_accept_orders_by_q_then_position():
    header = "text/csv;q=0.5, application/jsonlines, application/json;q=0.9, */*;q=0.1"
    assert parse_accept(header) == ["application/jsonlines", JSON, "text/csv", "*/*"]


def test_parse_accept_drops_q_zero_and_junk():
    header = "text/csv;q=0, nonsense, application/json;q=abc, application/jsonlines"
    assert parse_accept(header) == ["application/jsonlines"]
    assert parse_accept(None) == []
    assert parse_accept("") == []
    assert parse_accept(" , ") == []


def test_parse_accept_quoted_params_with_commas():
    types = parse_media_types('text/csv; header="a,b", application/json')
    assert [t.essence for t in types] == ["text/csv", JSON]
    assert types[0].params["header"] == "a,b"


def test_parse_content_type_missing_or_malformed_is_415():
    for header in (None, "", "   ", "json"):
        with pytest.raises(UnsupportedMediaType) as err:
            parse_content_type(header)
        assert error_status(err.value) == 415
        assert err.value.code == Code.INVALID_ARGUMENT
        assert "Unsupported Media Type" in err.value.message


# -- JSON requests ----------------------------------------------------------------------------


def test_tfs_request_passes_through_untouched():
    # Parsed once here and handed on whole (the TF Serving request rules judge it after).
    for body in (
        b'{"instances": [1.0, 2.0, 5.0]}',
        b'{"signature_name": "serving_default", "inputs": {"x": [1]}}',
        b'{"examples": [{"x": 1.0}], "context": {}}',
        b'{"junk": 1, "instances": "invalid"}',
        b'  {"instances": [NaN]}  ',
    ):
        assert json.dumps(to_tfs_request(body, JSON)) == json.dumps(json.loads(body))


def test_tfs_request_keys_only_count_at_top_level():
    # The container's regex also matches nested keys; only a top-level key makes a TFS request.
    assert instances('{"x": {"inputs": 1}}') == [{"x": {"inputs": 1}}]


def test_generic_json_is_wrapped_as_one_instance():
    # test_predict_generic_json, test_predict_bad_input_instances in the container's tests
    assert instances("[1.0, 2.0, 5.0]") == [[1.0, 2.0, 5.0]]
    assert instances('{"junk": "data"}') == [{"junk": "data"}]
    assert instances("3.5") == [3.5]
    assert instances('"text"') == ["text"]
    assert instances("[]") == [[]]
    assert instances('[{"a": 1}, {"a": 2}]') == [[{"a": 1}, {"a": 2}]]


def test_generic_json_list_of_lists_is_the_instances():
    # the container's `[[` rule (test_predict_generic_json_two_instances)
    assert instances("[[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]") == [[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]
    assert instances(" [ [1], [2] ] ") == [[1], [2]]


def test_ints_stay_ints_and_floats_floats():
    got = instances("[1, 2.0, -3, 1e3]")
    assert got == [[1, 2.0, -3, 1000.0]]
    assert [type(v) for v in got[0]] == [int, float, int, float]


@pytest.mark.parametrize("content_type", [JSON, "application/jsonlines", "application/jsons"])
def test_json_lines(content_type):
    # test_predict_jsons_json_content_type / jsonlines / jsons / jsons_2
    assert instances("[1.0, 2.0, 5.0]\n[1.0, 2.0, 5.0]", content_type) == [[1.0, 2.0, 5.0]] * 2
    assert instances('{"x": [1.0, 2.0]}\r\n\n  {"x": [3.0]}\n\n', content_type) == [
        {"x": [1.0, 2.0]},
        {"x": [3.0]},
    ]


def test_json_lines_single_line_follows_generic_rule():
    # the container sends all three JSON types through the same json_request
    assert instances("[[1, 2], [3, 4]]", "application/jsonlines") == [[1, 2], [3, 4]]
    body = b'{"instances": [1]}'
    assert to_tfs_request(body, "application/jsonlines") == {"instances": [1]}


def test_json_lines_of_tfs_requests_are_instances():
    assert instances('{"instances": [1]}\n{"instances": [2]}') == [
        {"instances": [1]},
        {"instances": [2]},
    ]


def test_json_lines_bad_line_is_named():
    with pytest.raises(InvalidArgument) as err:
        to_tfs_request(b'[1, 2]\n[3, 4]\n\n[5, oops]\n', "application/jsonlines")
    assert "Line 4" in err.value.message
    assert "column" in err.value.message


def test_json_pretty_document_with_error_reports_line_and_column():
    body = b'{\n  "instances": [\n    [1, 2],\n    [3, 4,]\n  ]\n}'
    with pytest.raises(InvalidArgument) as err:
        to_tfs_request(body, JSON)
    assert "not valid JSON" in err.value.message
    assert "line 4" in err.value.message


def test_malformed_json_single_line():
    with pytest.raises(InvalidArgument) as err:
        to_tfs_request(b"whatever", JSON)  # test_predict_bad_input
    assert "line 1, column 1" in err.value.message
    assert err.value.code == Code.INVALID_ARGUMENT


def test_empty_json_body():
    for body in (b"", b"  \n "):
        with pytest.raises(InvalidArgument, match="empty"):
            to_tfs_request(body, JSON)


def test_nan_and_infinity_are_accepted_like_tf_serving():
    got = instances("[NaN, Infinity, -Infinity]")
    assert got[0][0] != got[0][0]
    assert got[0][1:] == [float("inf"), float("-inf")]


def test_content_type_with_charset_and_case():
    assert instances("[1]", "Application/JSON; charset=utf-8") == [[1]]
    assert instances("1,2", "text/csv; charset=UTF-8; header=absent") == [[1, 2]]


def test_latin1_charset_is_decoded():
    body = '["café", "naïve"]'.encode("latin-1")
    assert instances(body, "application/json; charset=latin-1") == [["café", "naïve"]]
    latin1 = '{"instances": ["é"]}'.encode("latin-1")
    passthrough = to_tfs_request(latin1, "application/json; charset=iso-8859-1")
    assert passthrough == {"instances": ["é"]}
    assert instances('"a","é"'.encode("latin-1"), "text/csv; charset=latin-1") == [["a", "é"]]


def test_utf8_bom_is_dropped():
    body = b'\xef\xbb\xbf{"instances": [1]}'
    assert to_tfs_request(body, JSON) == {"instances": [1]}
    assert instances(b"\xef\xbb\xbf1,2", "text/csv") == [[1, 2]]


def test_invalid_utf8_names_the_line():
    with pytest.raises(InvalidArgument) as err:
        to_tfs_request(b'[1]\n[2]\n["\xff"]', JSON)
    assert "line 3" in err.value.message
    assert "utf-8" in err.value.message


def test_unknown_charset_is_415():
    with pytest.raises(UnsupportedMediaType, match="charset"):
        to_tfs_request(b"[1]", "application/json; charset=klingon")


def test_unsupported_type_is_415_and_mentions_handlers():
    with pytest.raises(UnsupportedMediaType) as err:
        to_tfs_request(b"abc", "application/x-image")
    assert error_status(err.value) == 415
    message = err.value.message
    assert message.startswith("Unsupported Media Type: application/x-image")
    assert "text/csv" in message and "inference.py" in message


# -- CSV requests -----------------------------------------------------------------------------


def test_csv_container_cases():
    # the container's test_container.py csv tests
    assert instances("1.0", "text/csv") == [1.0]
    assert instances("0.0", "text/csv") == [0.0]
    assert instances("0.0,2.0,5.0", "text/csv") == [[0.0, 2.0, 5.0]]
    assert instances("1.0,2.0,5.0\n1.0,2.0,5.0", "text/csv") == [[1.0, 2.0, 5.0]] * 2
    assert instances("1.0\n2.0\n5.0", "text/csv") == [1.0, 2.0, 5.0]
    wide = "0.0,1.0," * 15
    assert instances(f"{wide[:-1]}\n{wide[:-1]}\n", "text/csv") == [[0.0, 1.0] * 15] * 2


def test_csv_numbers_and_strings():
    got = instances('1,2.5,-3,+4,.5,1e-3,abc,"7", x y ,', "text/csv")
    assert got == [[1, 2.5, -3, 4, 0.5, 0.001, "abc", "7", " x y ", ""]]
    assert [type(v) for v in got[0][:4]] == [int, float, int, int]


def test_csv_quoted_fields_rfc4180():
    body = 'a,"b,c","say ""hi""",  "padded"  \n"multi\nline",2\n'
    assert instances(body, "text/csv") == [["a", "b,c", 'say "hi"', "padded"], ["multi\nline", 2]]


def test_csv_single_quoted_column_with_comma_is_scalar():
    # the container wraps this in extra brackets; one column is a scalar instance
    assert instances('"a,b"\n"c"', "text/csv") == ["a,b", "c"]


def test_csv_first_field_text_does_not_quote_numbers():
    # the container quotes every field (and splits only the first comma) when field 1 is text
    assert instances("abc,1,2,3", "text/csv") == [["abc", 1, 2, 3]]


def test_csv_blank_lines_and_crlf_are_skipped():
    assert instances("\r\n1,2\r\n\r\n  \r\n3,4\r\n", "text/csv") == [[1, 2], [3, 4]]


def test_csv_records_report_line_numbers():
    records = list(csv_records('a,b\n\n"x\ny",z\nlast'))
    assert [line for line, _ in records] == [1, 3, 5]
    assert records[1][1] == [("x\ny", True), ("z", False)]


def test_csv_unclosed_quote_names_the_line():
    with pytest.raises(InvalidArgument) as err:
        to_tfs_request(b'1,2\n3,"four\n5,6', "text/csv")
    assert "Line 2" in err.value.message and "never closed" in err.value.message


def test_csv_text_after_closing_quote_names_the_line():
    with pytest.raises(InvalidArgument) as err:
        to_tfs_request(b'1,2\n\n"a"b,3', "text/csv")
    assert "Line 3" in err.value.message and "'b'" in err.value.message


def test_csv_stray_quote_inside_unquoted_field_is_literal():
    assert instances('5" screen,2', "text/csv") == [['5" screen', 2]]


def test_csv_empty_body():
    with pytest.raises(InvalidArgument, match="no rows"):
        to_tfs_request(b"\n \n", "text/csv")


def test_csv_large_body():
    body = "\n".join("1.0,2.0,5.0" for _ in range(50_000)).encode()
    got = instances(body, "text/csv")
    assert len(got) == 50_000 and got[-1] == [1.0, 2.0, 5.0]


# -- responses --------------------------------------------------------------------------------

PRETTY = b'{\n    "predictions": [3.5, 4.0, 5.5\n    ]\n}'


def test_response_convert_json_and_wildcards():
    for accept in ([], ["*/*"], [JSON], ["application/*"]):
        assert from_tfs_response(PRETTY, accept) == (PRETTY, JSON)


def test_response_convert_jsonlines_is_the_answer_on_one_line_as_the_container_writes_it():
    out, content_type = from_tfs_response(PRETTY, ["application/jsonlines"])
    assert content_type == "application/jsonlines"
    assert out == PRETTY.replace(b"\n", b"") and b"\n" not in out and orjson.loads(out) == orjson.loads(PRETTY)


def test_response_convert_csv_rows():
    body = orjson.dumps({"predictions": [[3.5, 4.0], [1, 2]]})
    assert from_tfs_response(body, ["text/csv"]) == (b"3.5,4.0\n1,2\n", "text/csv")
    scalars = orjson.dumps({"results": [3.5, 4.0]})
    assert from_tfs_response(scalars, ["text/*"]) == (b"3.5\n4.0\n", "text/csv")
    classes = orjson.dumps({"results": [[["a,b", 0.25], ["c", 0.75]]]})
    assert from_tfs_response(classes, ["text/csv"])[0] == b'"a,b",0.25,c,0.75\n'
    nested = orjson.dumps({"predictions": [{"p": [1, 2], "ok": True, "none": None}]})
    assert from_tfs_response(nested, ["text/csv"])[0] == b"1,2,true,\n"


def test_response_convert_columnar_outputs():
    doc = {"outputs": {"a": [1, 2], "b": [[3], [4]]}}
    assert response_records(doc) == [{"a": 1, "b": [3]}, {"a": 2, "b": [4]}]
    assert response_records({"outputs": [5, 6]}) == [5, 6]
    assert response_records({"outputs": {"a": [1], "b": [1, 2]}}) == [{"a": [1], "b": [1, 2]}]
    assert response_records({"outputs": 7}) == [7]
    out, _ = from_tfs_response(orjson.dumps(doc), ["text/csv"])
    assert out == b"1,3\n2,4\n"


def test_response_convert_errors_stay_json():
    error = b'{ "error": "bad input" }'
    assert from_tfs_response(error, ["text/csv"]) == (error, JSON)


def test_response_convert_not_acceptable_is_406():
    with pytest.raises(NotAcceptable) as err:
        from_tfs_response(PRETTY, ["image/png", "text/html"])
    assert error_status(err.value) == 406
    assert "image/png" in err.value.message and "output_handler" in err.value.message


def test_negotiate_prefers_accept_order():
    offered = (JSON, "application/jsonlines", "text/csv")
    assert negotiate(["text/csv", JSON], offered) == "text/csv"
    assert negotiate(["image/*", "*/*"], offered) == JSON
    assert negotiate([], offered) == JSON


# -- custom attributes ------------------------------------------------------------------------


def test_custom_attributes_container_format():
    attrs = parse_custom_attributes("tfs-model-name=half_plus_three,tfs-method=regress")
    assert attrs.model_name == "half_plus_three"
    assert (attrs.model_version, attrs.method) == (None, "regress")
    assert attrs.raw == "tfs-model-name=half_plus_three,tfs-method=regress"
    assert attrs.extras == {}


def test_custom_attributes_version_extras_and_separators():
    attrs = parse_custom_attributes(
        " tfs-model-version = 123 ; trace=a=b==, tfs-model-name=m.v2_x-1,flag,tfs-other=1"
    )
    assert attrs.model_name == "m.v2_x-1"
    assert attrs.model_version == "123" and attrs.version_number == 123
    assert attrs.method is None
    assert attrs.extras == {"trace": "a=b==", "flag": "", "tfs-other": "1"}


def test_custom_attributes_absent_and_empty_values():
    assert parse_custom_attributes(None).raw is None
    assert parse_custom_attributes(None).model_name is None
    attrs = parse_custom_attributes("tfs-model-name=,tfs-method=")
    assert attrs.model_name is None and attrs.method is None


def test_custom_attributes_last_wins_and_keys_case_insensitive():
    attrs = parse_custom_attributes("tfs-model-name=a,TFS-Model-Name=b")
    assert attrs.model_name == "b"


@pytest.mark.parametrize(
    "header, named",
    [
        ("tfs-method=Predict", "tfs-method='Predict'"),
        ("tfs-method=explain", "tfs-method='explain'"),
        ("tfs-model-version=stable", "tfs-model-version='stable'"),
        ("tfs-model-version=-1", "tfs-model-version='-1'"),
        ("tfs-model-version=１", "tfs-model-version='１'"),
        ("tfs-model-name=../etc", "tfs-model-name='../etc'"),
        ("tfs-model-name=a/b", "tfs-model-name='a/b'"),
        ("tfs-model-name=a..b", "tfs-model-name='a..b'"),
        ("tfs-model-name=_x", "tfs-model-name='_x'"),
        ("tfs-model-name=a b", "tfs-model-name='a b'"),
    ],
)
def test_custom_attributes_invalid_values_are_400(header, named):
    with pytest.raises(InvalidArgument) as err:
        parse_custom_attributes(header)
    assert named in err.value.message
    assert "X-Amzn-SageMaker-Custom-Attributes" in err.value.message


def test_registry_aliases_and_record_kinds():
    from tfservo.codecs.media_types import guess_type, is_json_lines, lookup, record_kind

    assert lookup("application/x-jsonlines; charset=utf-8") is lookup("application/jsonlines")
    assert is_json_lines("application/jsons") and not is_json_lines(JSON)
    assert record_kind("text/csv") == "csv" and record_kind(JSON) == "json" and record_kind("image/png") is None
    assert guess_type("a.JSONL") == "application/jsonlines" and guess_type("b.jsons") == "application/jsons"
    assert guess_type("c.unknown") is None


def test_a_csv_body_sent_as_json_is_told_to_send_text_csv():
    for body in (b"1.0,2.0,3.0\n4.0,5.0,6.0", b"a,b\n"):
        with pytest.raises(InvalidArgument) as err:
            to_tfs_request(body, JSON)
        assert "looks like CSV: send it with Content-Type: text/csv" in err.value.message
    with pytest.raises(InvalidArgument) as err:  # broken JSON is not called CSV
        to_tfs_request(b'{"instances": [1, 2,}', JSON)
    assert "CSV" not in err.value.message
