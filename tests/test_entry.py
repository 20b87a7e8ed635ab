"""The entry is the one place a protocol function is described: its call builder, the declarations it honours, its dtype hint;
what can be derived from it is (the conventions' table, the rounding budgets, the references' surfaces)."""

import ast
from pathlib import Path

import numpy as np
import pytest

import invariants.reference.numpy as reference_numpy
from invariants.answers import floats, shape_of
from invariants.conventions import CONVENTIONS
from invariants.protocol import FUNCTIONS, ProtocolFunction, declarations, load_implementation
from invariants.registry import COMPONENTS

LAWS = Path(__file__).resolve().parent.parent / "invariants" / "laws"


def test_an_entry_honours_declarable_conventions_only():
    with pytest.raises(ValueError, match="ROPE_THETAS: not declarable"):
        ProtocolFunction("toy", ("x",), "same shape", "toy", arguments="any", answer_form=lambda x: floats(shape_of(x)),
                         honours=("ROPE_THETAS",))


def test_declarations_list_every_convention_with_the_functions_that_honour_it():
    listed = {d.name: d for d in declarations()}
    assert list(listed) == list(CONVENTIONS)
    assert all(d.honoured_by for d in listed.values()), [d.name for d in listed.values() if not d.honoured_by]
    # the two the hand-kept list missed (issue 35 §4)
    assert {"qk_norm_attention"} <= set(listed["ROPE_PAIRING"].honoured_by) & set(listed["ROPE_THETA"].honoured_by)
    # implied by the entry's kind: every answer with weights, every floating answer
    assert set(listed["ATTENTION_WEIGHTS"].honoured_by) == {name for name, e in FUNCTIONS.items() if "weights" in e.outputs}
    assert set(listed["COMPUTE_DTYPE"].honoured_by) == {name for name, e in FUNCTIONS.items() if e.floating}


# -- the declarations a law module reads are honoured by a function it holds ------------------------------------------------

GENERIC = {"read_declarations", "declared", "declared_skip", "first_reason", "CONVENTIONS", "Convention",
           "biases_as_declared", "_BIASES_LEFT_OUT"}  # read any convention they are given, or both bias conventions at once


def _named_conventions(node):
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in CONVENTIONS}


def _helpers(tree):
    """{top-level name: the conventions it names, through the module's own helpers it uses}."""
    direct, uses = {}, {}
    for node in tree.body:
        targets = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
            t.id for t in getattr(node, "targets", ()) if isinstance(t, ast.Name)]
        for name in targets:
            direct[name] = _named_conventions(node)
            uses[name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    changed = True
    while changed:
        changed = False
        for name, used in uses.items():
            extra = set().union(*(direct[u] for u in used if u in direct and u not in GENERIC))
            if not extra <= direct[name]:
                direct[name] |= extra
                changed = True
    return {name: found for name, found in direct.items() if name not in GENERIC}


def conventions_read(component):
    """The conventions a law module names, itself or through the helpers it imports from invariants.conventions and other law modules."""
    tree = ast.parse((LAWS / f"{component}.py").read_text(encoding="utf-8"))
    found = set().union(*_helpers(tree).values())
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in ("invariants.conventions", *(f"invariants.laws.{m}" for m in COMPONENTS)):
            source = LAWS.parent / "conventions.py" if node.module == "invariants.conventions" else LAWS / f"{node.module.rsplit('.', 1)[1]}.py"
            helpers = _helpers(ast.parse(source.read_text(encoding="utf-8")))
            found |= set().union(*(helpers.get(alias.name, set()) for alias in node.names))
    return found


@pytest.mark.parametrize("component", [c for c, holds in COMPONENTS.items() if holds])
def test_a_law_module_reads_only_declarations_its_functions_honour(component):
    """A convention a component's laws read is in the `honours` of a function it holds: the README's table is generated from those."""
    honoured = set().union(*(FUNCTIONS[name].declarations for name in COMPONENTS[component]))
    assert conventions_read(component) - honoured == set(), f"add them to the honours of one of {COMPONENTS[component]}"


def test_the_scan_sees_a_convention_read_through_a_helper():
    """The check itself: qk_norm reads ROPE_PAIRING through rope.rope_pairings and RMS_NORM_EPS through conventions.rms_norm_eps."""
    assert {"ROPE_PAIRING", "ROPE_THETA", "RMS_NORM_EPS", "ATTENTION_WEIGHTS"} <= conventions_read("qk_norm")


# -- the call builder ---------------------------------------------------------------------------------------------------------


def test_called_builds_the_call_from_drawn_inputs_with_changes_swapped_in():
    impl = load_implementation("reference.numpy")
    rng = np.random.default_rng(0)
    inputs = dict(x=rng.standard_normal((1, 3, 4)), W_q=np.eye(4), W_k=np.eye(4), W_v=np.eye(4), W_o=np.eye(4), n_heads=2, causal=True)
    entry = FUNCTIONS["attention"]
    assert entry.arguments_of(inputs) == tuple(inputs[p] for p in ("x", "W_q", "W_k", "W_v", "W_o", "n_heads", "causal"))
    out, weights = entry.called(impl, inputs, "call", causal=False)
    expected = reference_numpy.attention(*entry.arguments_of({**inputs, "causal": False}))
    np.testing.assert_array_equal(out, expected[0])
    np.testing.assert_array_equal(weights, expected[1])


def test_assert_parts_checks_the_weights_first_and_only_where_returned():
    entry = FUNCTIONS["gqa_attention"]
    out, weights = np.ones((1, 1, 2, 2)), np.full((1, 1, 2, 2), 0.5)
    entry.assert_parts((out, None), (out, weights + 1), "", "call")  # no weights returned: the output alone is compared
    with pytest.raises(AssertionError, match="gqa_attention weights"):
        entry.assert_parts((out + 1, weights), (out, weights + 1), "", "call")
    with pytest.raises(AssertionError, match="gqa_attention output of row 0"):
        entry.assert_parts((out + 1, weights), (out, weights), "of row 0", "call", select=lambda part, value: value[..., 0, :])


# -- the references' surface -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["invariants.reference.numpy", "invariants.reference.torch"])
def test_each_reference_exports_every_protocol_function_and_no_library(module):
    surface = __import__(module, fromlist=["__all__"]).__all__
    assert [name for name in FUNCTIONS if name not in surface] == []
    assert not {"np", "math", "torch", "annotations"} & set(surface)
    namespace = {}
    exec(f"from {module} import *", namespace)
    assert set(FUNCTIONS) <= set(namespace)
