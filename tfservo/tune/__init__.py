"""`tfservo tune`: settings for a bundle chosen from measurements (tfservo.tune.search), with a
load generator that needs nothing beyond tfservo's install (tfservo.tune.load)."""

from tfservo.tune.search import TuneOptions, TuneResult, tune

__all__ = ["TuneOptions", "TuneResult", "tune"]
