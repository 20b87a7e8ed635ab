"""The kill matrix machinery, on a small zoo: kills, survivors, the course checks' baseline, the command."""

import importlib
import json

import pytest

import reference.numpy
from invariants import REGISTRY, all_invariants
from invariants.mutants import Mutant, all_mutants
from invariants.mutants import matrix as kill_matrix_module
from invariants.mutants.course_checks import all_course_checks
from invariants.mutants.matrix import could_reach, kill_matrix, main, reachable, select, summarise

INVARIANTS = [inv for inv in all_invariants() if inv.component == "norms" or inv.name == "attention.causal_non_leakage"]
ZOO = [m for m in all_mutants() if m.killed_by in {inv.name for inv in INVARIANTS}]
EQUIVALENT = Mutant(  # no bug at all: the reference's own function swapped in, which nothing can kill
    name="test.reference_layer_norm",
    bug="none (the reference layer_norm)",
    killed_by="norms.layer_norm_affine",
    backend="numpy",
    replaces="layer_norm",
    function=reference.numpy.layer_norm,
)


@pytest.fixture(scope="module")
def rows():
    return kill_matrix([*ZOO, EQUIVALENT], INVARIANTS)


def test_every_real_mutant_is_killed_and_the_equivalent_one_survives(rows):
    by_name = {r.mutant: r for r in rows}
    assert not by_name[EQUIVALENT.name].killed
    killed = [r for r in rows if r.mutant != EQUIVALENT.name]
    assert killed and all(r.killed for r in killed), [r.mutant for r in killed if not r.killed]
    assert all(r.named_kills for r in killed), [r.mutant for r in killed if not r.named_kills]
    assert all(r.examples >= 1 and r.seconds >= 0 for r in killed)


def test_survivors_are_reported(rows):
    summary = summarise(rows)
    assert summary["survivors"] == [EQUIVALENT.name]
    table = kill_matrix_module.format_table(rows, summary)
    assert "SURVIVED" in table
    assert f"SURVIVORS: {EQUIVALENT.name}" in table


def test_the_course_checks_kill_fewer_mutants_than_the_suite(rows):
    summary = summarise(rows)
    assert 0 < summary["course_killed"] < summary["killed"], summary
    assert summary["ratio"] == summary["killed"] / summary["course_killed"]


def test_the_first_failure_follows_registry_order(rows):
    order = [inv.name for inv in INVARIANTS]
    for row in rows:
        if row.killed and not row.named_first:  # something earlier in the order failed first
            assert order.index(row.first_failure) < order.index(row.killed_by), row


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(
    "caller, callee, reaches",
    [
        ("softmax", "softmax", True),
        ("attention", "softmax", True),
        ("transformer_block", "layer_norm", True),
        ("gpt_logits", "gelu", True),  # model -> block -> feed_forward -> gelu
        ("moe", "top_k_indices", True),
        ("layer_norm", "softmax", False),
        ("attention", "gelu", False),
        ("top_k_gates", "feed_forward", False),
    ],
)
def test_reachable_follows_calls_through_the_module(backend, caller, callee, reaches):
    if backend == "torch":
        pytest.importorskip("torch")  # reference.torch wraps its norms and softmax in a decorator: closures are followed
    assert (callee in reachable(importlib.import_module(f"reference.{backend}"), caller)) is reaches


def test_pruning_keeps_the_first_failures():
    subset = [m for m in ZOO if m.killed_by.startswith("norms.")][:2]
    by_component = {c: [inv for inv in all_invariants() if inv.component == c] for c in ("activation", "norms")}
    invariants = by_component["activation"] + by_component["norms"]  # run in this order; gelu cannot reach the norms
    assert not any(could_reach(inv, subset[0].namespace(), subset[0].replaces) for inv in invariants if inv.component == "activation")
    pruned = kill_matrix(subset, invariants)
    full = kill_matrix(subset, invariants, prune=False)
    assert [(r.first_failure, r.examples) for r in pruned] == [(r.first_failure, r.examples) for r in full]
    assert all(r.invariants_pruned > 0 for r in pruned) and all(r.invariants_pruned == 0 for r in full)


def test_worker_processes_give_the_same_matrix():
    subset = ZOO[:2]  # each worker process imports the suite and the zoo: a few seconds
    alone = kill_matrix(subset, INVARIANTS)
    pooled = kill_matrix(subset, INVARIANTS, jobs=2)
    assert [(r.mutant, r.first_failure, r.examples) for r in pooled] == [(r.mutant, r.first_failure, r.examples) for r in alone]


def test_course_checks_pass_on_the_references():
    from invariants import load_implementation

    for target in ("reference.numpy", "reference.torch"):
        if target == "reference.torch":
            pytest.importorskip("torch")
        impl = load_implementation(target)
        for check in all_course_checks():
            if check.skip_reason(impl) is None:
                check(impl)


@pytest.mark.parametrize(
    "pattern, expected",
    [("norms.*", lambda n: n.startswith("norms.")), ("layer_norm", lambda n: "layer_norm" in n), ("no-such-mutant", lambda n: False)],
)
def test_only_selects_by_glob_or_substring(pattern, expected):
    mutants = all_mutants()
    assert [m.name for m in select(mutants, pattern)] == [m.name for m in mutants if expected(m.name)]


def test_command_exit_status_and_json(monkeypatch, capsys):
    monkeypatch.setattr(kill_matrix_module, "all_invariants", lambda: [REGISTRY[ZOO[0].killed_by], REGISTRY[EQUIVALENT.killed_by]])
    monkeypatch.setattr(kill_matrix_module, "all_mutants", lambda: [*ZOO[:1], EQUIVALENT])
    assert main(["--only", ZOO[0].name, "--format", "json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["summary"]["kill_rate"] == 1.0 and report["rows"][0]["mutant"] == ZOO[0].name
    assert main(["--format", "markdown"]) == 1  # the equivalent mutant survives
    out, err = capsys.readouterr()
    assert f"| {EQUIVALENT.name} | SURVIVED |" in out
    assert f"[2/2] {EQUIVALENT.name}: SURVIVED" in err  # progress, on stderr


def test_command_refuses_a_pattern_that_matches_nothing(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "no-such-mutant"])
    assert exit_.value.code == 2
    assert "--only='no-such-mutant' matches no mutant" in capsys.readouterr().err


def test_the_named_invariants_exist():
    assert all(m.killed_by in REGISTRY for m in ZOO)


def test_a_signature_is_named_only_by_invariants_that_failed():
    """A naming invariant that held in this run cannot be the diagnosis: the signature leaves it out, and keeps killed_by."""
    row = kill_matrix_module.Row("m", "a bug", "softmax.a", failing=["softmax.a", "softmax.b"], held=["softmax.c"],
                                 named_by=("softmax.a", "softmax.b", "softmax.c"))
    assert kill_matrix_module.signatures_of([row])["m"]["named_by"] == ["softmax.a", "softmax.b"]
