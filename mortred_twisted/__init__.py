"""mortred-twisted: an AI model server on the Twisted reactor."""

__version__ = "0.1.0"
