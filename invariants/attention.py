"""Invariants of attention (being written)."""
