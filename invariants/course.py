"""Invariants of course (being written)."""
