"""perfgate: an MCP tool server that makes deep-learning training faster, with evidence."""

__all__ = ["__version__"]

__version__ = "0.1.0"
