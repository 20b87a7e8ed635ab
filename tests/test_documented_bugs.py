"""The catalogue of documented bugs (invariants/mutants/documented.py): sourced, real, and caught wherever the suite reaches.

- every entry cites its tracker thread(s) as owner/repo#number and quotes the shipped line;
- the catalogue stays apart from the synthetic zoo (its own registry, not in ZOO_MODULES);
- a documented bug not marked `needs=...` is killed at the ci profile by the invariant it names;
  one marked `needs=...` survives today (strict xfail: once issue 10 §1 reaches its region the
  test XPASSes and fails, saying to drop `needs`), and a hand-built input from that region shows
  the bug is real;
- every negative control (reported, shown equivalent) passes every invariant that exercises the
  function it replaces.
"""

import math
import warnings

import numpy as np
import pytest

import invariants.mutants
import invariants.reference.numpy as ref
from invariants import REGISTRY, all_invariants, run_invariant
from invariants.mutants.documented import SOURCE_FORM, DocumentedMutant, EquivalentControl, documented_mutants, equivalent_controls, source_url
from invariants.profiles import profile_settings

all_invariants()
CI = profile_settings("ci")
DOCUMENTED = documented_mutants()
CONTROLS = equivalent_controls()
SHRINK = 20  # a kill needs the report, not the smallest example

# The protocol functions that, in the reference, call each function a control replaces (itself included):
# an invariant exercises the replacement when it requires one of them.
CALLERS = {
    "softmax": {"softmax", "attention", "transformer_block", "gpt_logits", "top_k_gates", "moe", "load_balancing_loss"},
    "top_k_gates": {"top_k_gates", "moe"},
    "attention": {"attention", "transformer_block", "gpt_logits"},
    "rms_norm": {"rms_norm"},
    "layer_norm": {"layer_norm", "transformer_block", "gpt_logits"},
    "gelu": {"gelu", "feed_forward", "transformer_block", "gpt_logits", "moe"},
}


def _ids(entries):
    return [e.name for e in entries]


def test_the_catalogue_has_at_least_fifteen_documented_bugs_and_a_negative_control():
    assert len(DOCUMENTED) >= 15, f"only {len(DOCUMENTED)} documented bugs"
    assert CONTROLS, "no negative control"
    names = _ids(DOCUMENTED) + _ids(CONTROLS)
    assert len(names) == len(set(names))
    assert all(name.startswith("documented.") for name in names)


def test_the_catalogue_is_kept_apart_from_the_synthetic_zoo():
    assert "documented" not in invariants.mutants.ZOO_MODULES
    zoo = {m.name for m in invariants.mutants.all_mutants()}
    assert not zoo & set(_ids(DOCUMENTED) + _ids(CONTROLS))
    assert all(isinstance(m, DocumentedMutant) for m in DOCUMENTED)
    assert all(isinstance(c, EquivalentControl) and c.killed_by is None for c in CONTROLS)


@pytest.mark.parametrize("entry", DOCUMENTED + CONTROLS, ids=_ids(DOCUMENTED + CONTROLS))
def test_every_entry_cites_its_source_and_quotes_the_shipped_code(entry):
    for source in (entry.source, *entry.also):
        assert SOURCE_FORM.match(source), f"{entry.name}: {source!r} is not owner/repo#number"
    assert source_url(entry.source).startswith("https://github.com/") and source_url(entry.source).endswith(entry.source.split("#")[1])
    assert entry.original.strip(), f"{entry.name} does not quote the shipped line"
    assert entry.project.strip() and entry.bug.strip()
    assert entry.backend in ("numpy", "torch") and entry.dtype in ("float64", "float32", "float16", "bfloat16")
    assert hasattr(ref, entry.replaces), f"{entry.name} replaces {entry.replaces!r}, which the reference does not define"
    if isinstance(entry, EquivalentControl):
        assert entry.why.strip(), f"{entry.name} does not say why it is equivalent"
    else:
        assert entry.killed_by in REGISTRY, f"{entry.name} names an unknown invariant {entry.killed_by!r}"
        assert entry.needs is None or entry.needs.strip()


def _kill_case(m):
    marks = [pytest.mark.xfail(strict=True, reason=f"survives at ci until the suite reaches: {m.needs}")] if m.needs else []
    return pytest.param(m, id=m.name, marks=marks)


@pytest.mark.parametrize("mutant", [_kill_case(m) for m in DOCUMENTED])
def test_the_named_invariant_kills_the_documented_bug_at_ci(mutant):
    inv = REGISTRY[mutant.killed_by]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow in the shipped code is the bug, not noise
        outcome = run_invariant(inv, mutant.implementation(), settings=CI, shrink_limit=SHRINK)
    assert outcome.status in ("failed", "error") and not outcome.check_crashed, f"{mutant.name} survived: {outcome.status}, {outcome.reason}"
    assert outcome.report.startswith(f"{inv.name}: "), outcome.report
    assert f"hint: {inv.hint}" in outcome.report


# Inputs from the region each surviving bug needs (the numbers of its report where it gives them):
# proof that the mutant is a real bug the strategies do not reach yet, not a harmless rewrite. A bug the
# suite has since learnt to kill keeps its witness: the region it was found in stays on record.
def _gpt2_mask(ns):
    x, W_q, W_k, one = np.ones((1, 2, 1)), np.array([[100.0]]), np.array([[-100.0]]), np.array([[1.0]])  # every score -1e4
    got = ns.attention(x, W_q, W_k, one, one, 1, True)[1]
    return got[0, 0, 0], ref.attention(x, W_q, W_k, one, one, 1, True)[1][0, 0, 0]  # first query: (0.5, 0.5), not (1, 0)


def _naive_softmax_sdpa(ns):
    x, W = np.ones((1, 2, 1), np.float32), np.array([[10.0]], np.float32)  # scores of 100 > 88.7
    return ns.attention(x, W, W, W, W, 1, True)[1][0, 0], ref.attention(x.astype(np.float64), *(W.astype(np.float64),) * 4, 1, True)[1][0, 0]


def _naive_variance(ns):
    import torch

    x = (np.random.default_rng(0).standard_normal((3, 4)) + 2000).astype(np.float32)  # the report's mean 2000, std 1
    got = ns.layer_norm(torch.from_numpy(x), torch.ones(4), torch.zeros(4)).numpy()
    return got, ref.layer_norm(x.astype(np.float64), np.ones(4), np.zeros(4))


def _log_softmax_adds_max_first(ns):
    logits, targets = np.array([[1e8, 1e8]], np.float32), np.array([1])  # the report's example
    return ns.cross_entropy(logits, targets), math.log(2.0)


WITNESSES = {
    "documented.gpt2_finite_causal_mask": _gpt2_mask,
    "documented.executorch_naive_softmax_sdpa": _naive_softmax_sdpa,
    "documented.pytorch_cpu_layer_norm_naive_variance": _naive_variance,
    "documented.pytorch_log_softmax_adds_max_first": _log_softmax_adds_max_first,
}
SURVIVORS = [m for m in DOCUMENTED if m.needs]


WITNESSED = [m for m in DOCUMENTED if m.name in WITNESSES]


def test_every_survivor_has_a_witness_from_the_region_it_needs():
    assert {m.name for m in SURVIVORS} <= set(WITNESSES) <= {m.name for m in DOCUMENTED}


@pytest.mark.parametrize("mutant", WITNESSED, ids=_ids(WITNESSED))
def test_a_witnessed_bug_is_real_in_the_region_it_needs(mutant):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, expected = WITNESSES[mutant.name](mutant.namespace())
    got = np.asarray(got, dtype=np.float64)
    assert not np.allclose(got, expected, rtol=1e-2, atol=1e-2, equal_nan=False), f"{mutant.name} behaves on {expected}: {got}"


def _control_cases():
    for control in CONTROLS:
        assert control.replaces in CALLERS, f"say which protocol functions call {control.replaces} (CALLERS)"
        for inv in REGISTRY.values():
            if set(inv.requires) & CALLERS[control.replaces]:
                yield pytest.param(control, inv, id=f"{control.name}-{inv.name}")


@pytest.mark.parametrize(("control", "inv"), list(_control_cases()))
def test_a_negative_control_passes_every_invariant_that_exercises_it(control, inv):
    outcome = run_invariant(inv, control.implementation(), settings=CI, shrink_limit=SHRINK)
    assert outcome.status in ("passed", "skipped"), f"{control.name} is equivalent ({control.why}) but failed:\n{outcome.report}"
    if outcome.status == "skipped":  # only for another backend or in-process needs, never for the control's own answers
        assert "backend" in outcome.reason or "own callables" in outcome.reason, outcome.reason


@pytest.mark.parametrize("control", CONTROLS, ids=_ids(CONTROLS))
def test_a_negative_control_is_exercised_by_some_invariant(control):
    assert any(set(inv.requires) & CALLERS[control.replaces] for inv in REGISTRY.values())
