"""Broken model (being written)."""
