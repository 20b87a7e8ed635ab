"""Broken counts (being written)."""
