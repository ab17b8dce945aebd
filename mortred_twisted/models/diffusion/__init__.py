"""Generative diffusion models: DDPM, DDIM, CLS_COND_DDIM and LDM (torch).

Each catalog id is a :class:`~mortred_twisted.sdk.ServedModel` class
(``ddpm:DdpmModel``, ``ddim:DdimModel``, ``cls_cond_ddim:ClsCondDdimModel``,
``ldm:LdmModel``) that :mod:`mortred_twisted.models.registry` imports lazily;
importing this package imports no torch. See docs/models/diffusion.md.
"""
