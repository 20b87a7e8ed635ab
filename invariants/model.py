"""Invariants of model (being written)."""
