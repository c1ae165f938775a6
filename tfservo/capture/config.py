"""SageMaker's DataCaptureConfig, read from the JSON users write for CreateEndpointConfig."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfservo.core.json_files import read_json_file
from tfservo.core.settings import ConfigError

__all__ = ["CaptureConfig", "capture_config_from_dict", "read_capture_config"]

# The API's names, and the SageMaker SDK's (which it maps to them)
_MODES = {"input": "Input", "output": "Output", "request": "Input", "response": "Output"}


@dataclass(frozen=True)
class CaptureConfig:
    """What to capture, how often and where (an s3:// prefix or a local folder)."""

    destination: str
    sampling_percentage: float = 100.0
    enabled: bool = True
    capture_input: bool = True
    capture_output: bool = True
    csv_content_types: tuple[str, ...] = ()  # empty lists: every body is captured as BASE64
    json_content_types: tuple[str, ...] = ()

    def encoding(self, content_type: str | None) -> str:
        """CSV, JSON or BASE64, by the body's media type (parameters ignored), as SageMaker does."""
        media = (content_type or "").split(";", 1)[0].strip().lower()
        if media in self.csv_content_types:
            return "CSV"
        if media in self.json_content_types:
            return "JSON"
        return "BASE64"


def read_capture_config(path: str) -> CaptureConfig:
    """The DataCaptureConfig in the JSON file at `path` (ConfigError naming the file and key)."""
    doc = read_json_file(path, "--data-capture-config")
    if isinstance(doc, dict) and isinstance(doc.get("DataCaptureConfig"), dict):
        doc = doc["DataCaptureConfig"]  # a whole CreateEndpointConfig request
    return capture_config_from_dict(doc, path)


def capture_config_from_dict(doc: object, where: str = "DataCaptureConfig") -> CaptureConfig:
    """DataCaptureConfig's fields (CreateEndpointConfig's names) as a CaptureConfig."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: expected a JSON object with DestinationS3Uri, InitialSamplingPercentage and CaptureOptions")
    destination = doc.get("DestinationS3Uri")
    if not isinstance(destination, str) or not destination.strip():
        raise ConfigError(f"{where}: DestinationS3Uri must be an s3:// prefix or a local folder")
    sampling = doc.get("InitialSamplingPercentage", 100)
    if isinstance(sampling, bool) or not isinstance(sampling, (int, float)) or not 0 <= sampling <= 100:
        raise ConfigError(f"{where}: InitialSamplingPercentage must be a number from 0 to 100, got {sampling!r}")
    enabled = doc.get("EnableCapture", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: EnableCapture must be true or false, got {enabled!r}")
    modes = _capture_modes(doc.get("CaptureOptions", [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}]), where)
    header = doc.get("CaptureContentTypeHeader") or {}
    if not isinstance(header, Mapping):
        raise ConfigError(f"{where}: CaptureContentTypeHeader must be an object with CsvContentTypes and/or JsonContentTypes")
    return CaptureConfig(
        destination=destination.strip(),
        sampling_percentage=float(sampling),
        enabled=enabled,
        capture_input="Input" in modes,
        capture_output="Output" in modes,
        csv_content_types=_media_types(header.get("CsvContentTypes", ()), f"{where}: CsvContentTypes"),
        json_content_types=_media_types(header.get("JsonContentTypes", ()), f"{where}: JsonContentTypes"),
    )


def _capture_modes(options: object, where: str) -> set[str]:
    if not isinstance(options, Sequence) or isinstance(options, str) or not options:
        raise ConfigError(f'{where}: CaptureOptions must be a list such as [{{"CaptureMode": "Input"}}, {{"CaptureMode": "Output"}}]')
    modes = set()
    for option in options:
        mode = option.get("CaptureMode") if isinstance(option, Mapping) else None
        if not isinstance(mode, str) or mode.lower() not in _MODES:
            raise ConfigError(f"{where}: CaptureOptions: CaptureMode must be Input or Output (REQUEST or RESPONSE in the SDK), got {mode!r}")
        modes.add(_MODES[mode.lower()])
    return modes


def _media_types(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where} must be a list of media types such as ["text/csv"]')
    return tuple(v.split(";", 1)[0].strip().lower() for v in value)
