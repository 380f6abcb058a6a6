"""fleet-rlm: a workspace for recursive language models."""

__version__ = "0.1.0"
