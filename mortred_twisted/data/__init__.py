"""Datasets generated or shipped with packages (training and evaluation only)."""
