"""Invariants of activation (being written)."""
