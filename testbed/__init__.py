"""testbed: a network emulation harness for geo-distributed LLM training."""

__version__ = "0.1.0"
