"""shoal: a distributed dataset cache for AI training."""

__version__ = "0.1.0"
