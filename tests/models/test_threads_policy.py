"""torch's thread policy: CPUs shared among workers; applied only where torch is loaded."""

from __future__ import annotations

import os
import sys

from mortred_twisted.models.threads import apply_torch_threads, torch_threads_for


def test_configured_value_wins() -> None:
    """A positive torch_threads is used as is."""
    assert torch_threads_for(3, 2) == 3


def test_auto_divides_cpus_among_workers() -> None:
    """0 means CPUs // workers, never below 1."""
    cpus = os.cpu_count() or 1
    assert torch_threads_for(0, 1) == cpus
    assert torch_threads_for(0, cpus * 4) == 1


def test_applied_only_when_torch_is_loaded(monkeypatch) -> None:
    """Without torch imported nothing happens (the fake model never imports it)."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert apply_torch_threads(1) is False


def test_applied_to_torch() -> None:
    """With torch loaded the intra-op thread count is set."""
    import torch

    before = torch.get_num_threads()
    try:
        assert apply_torch_threads(1) is True
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
