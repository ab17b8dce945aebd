"""The in-memory HTTP client moved to the public :mod:`mortred_twisted.testing.memory_http`
(users' tests use it too); this name stays for the project's own tests."""

from mortred_twisted.testing.memory_http import MemoryClient, MemoryResponse

__all__ = ["MemoryClient", "MemoryResponse"]
