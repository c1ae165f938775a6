"""`python -m tfservo …`: the same command line as the `tfservo` script."""

from tfservo.cli import run

run()
