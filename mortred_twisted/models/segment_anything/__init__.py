"""Perception family: see docs/models/perception.md (torch is imported only by its modules)."""
