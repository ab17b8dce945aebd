"""Command-line tools (``mortredctl``)."""
