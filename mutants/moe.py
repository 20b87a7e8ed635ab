"""Broken moe (being written)."""
