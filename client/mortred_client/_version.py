"""The client's version: the server's (one release, one number)."""

__version__ = "0.1.0"
