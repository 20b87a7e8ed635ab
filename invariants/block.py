"""Invariants of block (being written)."""
