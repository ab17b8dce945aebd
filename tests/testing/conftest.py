"""The public fixtures, as a user's suite loads them (see pytest_plugin's docstring)."""

from mortred_twisted.testing.pytest_plugin import model_harness, served_model

__all__ = ["model_harness", "served_model"]
