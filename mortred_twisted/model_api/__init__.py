"""The model interface below both the families (``models/``) and the SDK (``sdk/``):
the :class:`~mortred_twisted.model_api.base.Model` contract, the seed's params rules,
input limits and the table of built-in types. Imports no torch, no Twisted."""
