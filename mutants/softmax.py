"""Broken softmax (being written)."""
