"""The command lines: `tfservo` (serve, invoke, inspect, transform, evaluate) and
`tensorflow_model_server` (TF Serving's flags). Each parses its arguments and calls the parts
that do the work."""

from tfservo.cli.commands import main, run

__all__ = ["main", "run"]
