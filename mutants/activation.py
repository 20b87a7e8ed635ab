"""Broken activation (being written)."""
