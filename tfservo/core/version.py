"""tfservo's version, in the kernel so that any layer can name it (server metadata, user agents)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
