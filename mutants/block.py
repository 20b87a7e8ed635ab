"""Broken block (being written)."""
