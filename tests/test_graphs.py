"""invariants.graphs: the one reachability walk of the gate's scan, the zoo's pruning and the diagnosis."""

from invariants.graphs import reachable_from

GRAPH = {"a": ["b"], "b": ["c", "a"], "c": [], "d": ["a"]}  # a -> b -> c, b -> a (a cycle), d -> a


def successors(node):
    return GRAPH.get(node, [])


def test_reaches_through_cycles_and_keeps_the_starts():
    assert reachable_from(["a"], successors) == {"a", "b", "c"}


def test_never_walks_against_an_edge():
    assert reachable_from(["c"], successors) == {"c"}
    assert "d" not in reachable_from(["a", "b"], successors)


def test_a_node_outside_the_graph_reaches_only_itself():
    assert reachable_from(["z"], successors) == {"z"}
    assert reachable_from([], successors) == set()
