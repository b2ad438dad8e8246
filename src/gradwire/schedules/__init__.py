"""Algorithms as schedules: one module per family, one registry (``registry.py``)."""
