"""Invariants of softmax (being written)."""
