"""SageMaker Data Capture: sampled invocations written as Model Monitor's JSON lines."""

from tfservo.capture.config import CaptureConfig, read_capture_config
from tfservo.capture.writer import CaptureWriter

__all__ = ["CaptureConfig", "CaptureWriter", "read_capture_config"]
