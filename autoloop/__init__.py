"""autoloop: an autonomous experiment-loop harness for ML research."""

__version__ = "0.1.0"
