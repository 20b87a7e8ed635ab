"""Broken attention (being written)."""
