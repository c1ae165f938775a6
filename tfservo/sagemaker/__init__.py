"""The SageMaker layer: content types, custom attributes, inference.py handlers, invocations."""
