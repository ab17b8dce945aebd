"""The seed's wire contract (``contract = "mortred-v1"``) as adapters over the task models.

Each module maps one task model of :mod:`mortred_twisted.models.transformers_tasks`
onto the contract the shipped catalog entries have always answered with: the
envelope's ``images`` into the task's pictures (several per request, answered as
``{"results": [...]}``), the legacy ``params`` (names, bounds, 422 messages) into
the task's inputs, the task's outputs into the legacy ``data`` shapes. The task's
loading and forward pass are the only implementation (see :mod:`.common`).
"""
