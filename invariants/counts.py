"""Invariants of counts (being written)."""
