"""tfservo: serve SageMaker-style TensorFlow model bundles without Docker, AWS or TF Serving's binary."""

__version__ = "0.1.0"
