"""Invariants of feed_forward (being written)."""
