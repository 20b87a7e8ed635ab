"""Broken feed_forward (being written)."""
