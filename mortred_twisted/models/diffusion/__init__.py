"""Generative diffusion models: DDPM, DDIM, CLS_COND_DDIM and LDM (torch).

Families are imported lazily by :mod:`mortred_twisted.models.registry`
(``ddpm:create``, ``ddim:create``, ``cls_cond_ddim:create``, ``ldm:create``); importing
this package imports no torch. See docs/models/diffusion.md.
"""
