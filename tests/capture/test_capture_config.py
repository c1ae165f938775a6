"""DataCaptureConfig as users write it for CreateEndpointConfig: what is accepted, and the
errors that name the file and the key."""

from __future__ import annotations

import json

import pytest

from tfservo.capture.config import capture_config_from_dict, read_capture_config
from tfservo.core.settings import ConfigError

SDK_DICT = {  # what sagemaker.model_monitor.DataCaptureConfig._to_request_dict() sends
    "EnableCapture": True, "InitialSamplingPercentage": 20, "DestinationS3Uri": "s3://bucket/capture",
    "CaptureOptions": [{"CaptureMode": "REQUEST"}, {"CaptureMode": "RESPONSE"}],
    "CaptureContentTypeHeader": {"CsvContentTypes": ["text/csv"], "JsonContentTypes": ["application/json"]},
}


def test_the_sdks_and_the_apis_spellings_are_read() -> None:
    api = {**SDK_DICT, "CaptureOptions": [{"CaptureMode": "Input"}]}
    config = capture_config_from_dict(api)
    assert (config.sampling_percentage, config.capture_input, config.capture_output) == (20.0, True, False)
    assert config.encoding("text/csv; charset=utf-8") == "CSV" and config.encoding("application/json") == "JSON"
    assert config.encoding("image/png") == "BASE64"
    assert capture_config_from_dict({**api, "CaptureContentTypeHeader": None}).encoding("text/csv") == "BASE64"


def test_the_sdks_request_and_response_modes_are_input_and_output() -> None:
    config = capture_config_from_dict(SDK_DICT)
    assert config.capture_input and config.capture_output


@pytest.mark.parametrize(("change", "says"), [
    ({"DestinationS3Uri": ""}, "DestinationS3Uri"),
    ({"InitialSamplingPercentage": 101}, "InitialSamplingPercentage"),
    ({"CaptureOptions": [{"CaptureMode": "Both"}]}, "CaptureMode must be Input or Output"),
    ({"CaptureContentTypeHeader": {"CsvContentTypes": "text/csv"}}, "CsvContentTypes must be a list"),
    ({"EnableCapture": "yes"}, "EnableCapture"),
])
def test_mistakes_are_named(change, says, tmp_path) -> None:
    path = tmp_path / "capture.json"
    path.write_text(json.dumps({**SDK_DICT, **change}))
    with pytest.raises(ConfigError) as caught:
        read_capture_config(str(path))
    assert str(path) in str(caught.value) and says in str(caught.value)


def test_a_whole_create_endpoint_config_request_is_accepted(tmp_path) -> None:
    path = tmp_path / "endpoint-config.json"
    path.write_text(json.dumps({"EndpointConfigName": "c", "ProductionVariants": [], "DataCaptureConfig": SDK_DICT}))
    assert read_capture_config(str(path)).destination == "s3://bucket/capture"
