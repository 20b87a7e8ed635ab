"""Reachability over a directed graph given by its successors: the one walk the gate's scan, the zoo and the diagnosis share."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable


def reachable_from(starts: Iterable[Hashable], successors: Callable[[Hashable], Iterable[Hashable]]) -> set:
    """Every node that following `successors` (node -> its successors) reaches from `starts`, the starts included."""
    seen, todo = set(), list(starts)
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(successors(current))
    return seen
