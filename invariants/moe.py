"""Invariants of moe (being written)."""
