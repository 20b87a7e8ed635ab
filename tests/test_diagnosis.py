"""The diagnosis names the bug from the pattern of failures: root causes first, calibrated on the zoo, measured leave-one-out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from invariants.diagnosis import (
    DEPENDS,
    SYMPTOMS,
    diagnose,
    leave_one_out_accuracy,
    likely_bugs,
    load_signatures,
    named_by,
    non_finite_first,
    root_failures,
)
from invariants.protocol import FUNCTIONS
from invariants.registry import COMPONENTS, REGISTRY, all_invariants
from invariants.runner import run_invariant

all_invariants()
SIGNATURES = load_signatures()


def test_the_shipped_signatures_name_zoo_mutants_and_registered_invariants():
    """A mutant added since the last `python -m invariants.mutants.matrix --whole --signatures` is diagnosed from the others."""
    from invariants.mutants import all_mutants

    assert set(SIGNATURES) <= {m.name for m in all_mutants()}, "a signature names a mutant the zoo no longer has: regenerate them"
    for name, signature in SIGNATURES.items():
        assert set(signature["failing"]) <= set(REGISTRY) and set(signature["held"]) <= set(REGISTRY), name
        assert signature["killed_by"] in named_by(signature) <= set(signature["failing"]), f"{name}: an invariant that names it does not fail it"


def test_every_component_says_which_components_it_builds_on():
    assert set(DEPENDS) == set(COMPONENTS) and all(set(below) <= set(COMPONENTS) for below in DEPENDS.values())
    assert DEPENDS["block"] == ("norms", "attention", "feed_forward") and DEPENDS["decoding"] == ("llama",)
    assert DEPENDS["cross_attention"] == ("norms", "attention", "feed_forward")  # softmax is below attention: not named twice


def test_every_protocol_function_is_held_to_the_laws_of_a_component():
    held = {name for functions in COMPONENTS.values() for name in functions}
    assert held == set(FUNCTIONS), sorted(set(FUNCTIONS) ^ held)


# Where the reference composes a function from another that the protocol does not ask it to build on.
REFERENCE_SHORTCUTS = {"llama_logits": {"llama_decode"}, "hybrid_logits": {"hybrid_decode"}, "cross_attention": {"gqa_attention"}}


@pytest.mark.parametrize("reference", ["reference.numpy", "reference.torch"])
def test_what_each_entry_builds_on_is_what_the_reference_calls(reference):
    """The entries' builds_on, closed, against the call graph invariants.mutants.matrix computes from the reference's code."""
    from invariants.mutants.matrix import reachable

    namespace = pytest.importorskip(reference)
    for name, entry in FUNCTIONS.items():
        declared, todo = set(), list(entry.builds_on)
        while todo:
            part = todo.pop()
            if part not in declared:
                declared.add(part)
                todo.extend(FUNCTIONS[part].builds_on)
        calls = (reachable(namespace, name) & set(FUNCTIONS)) - {name}
        shortcuts = set().union(*(REFERENCE_SHORTCUTS.get(part, set()) for part in declared | {name}))
        assert calls - shortcuts <= declared, name
        leaves = {part for part in declared if not FUNCTIONS[part].builds_on}  # the composites may be reached through helpers
        assert leaves <= calls | {"swiglu"}, name  # swiglu: the experts moe builds under EXPERT_FFN = "swiglu"


def test_a_failing_rms_norm_is_the_root_of_the_llama_and_decoding_failures_above_it():
    failed = {"norms.rms_norm_scale_law", "llama.block_agrees_with_reference", "decoding.decode_matches_full_forward"}
    assert failed <= set(REGISTRY) and root_failures(failed) == {"norms.rms_norm_scale_law"}


def test_a_failing_norm_is_the_root_of_the_block_and_model_failures_above_it():
    failed = {"norms.layer_norm_known_values", "block.residual_identity", "model.causal_non_leakage", "softmax.softmax_rows_sum_to_one"}
    assert root_failures(failed) == {"norms.layer_norm_known_values", "softmax.softmax_rows_sum_to_one"}


def test_an_unbiased_variance_pattern_is_diagnosed_as_the_layer_norm_bug_and_resembles_it():
    own = SIGNATURES["norms.unbiased_layer_norm"]
    ranked = diagnose(own["failing"], own["held"])
    assert ranked[0].invariant == "norms.layer_norm_known_values"
    assert "block.agrees_with_reference" in ranked[0].explained
    assert ranked[0].resembles[0] == ("norms.unbiased_layer_norm", own["bug"])
    assert all(d.invariant.startswith("norms.") for d in ranked)  # the block and model failures follow from it


def test_nothing_failed_means_no_diagnosis():
    assert diagnose(set(), {"norms.layer_norm_known_values"}) == []


def test_likely_bugs_leads_with_the_bug_and_reads_only_the_outcomes_given():
    """The lines the plugin, the gate and the HTML report show: NaN first, then the bug with its hint; nothing about what was left out."""
    own = SIGNATURES["norms.unbiased_layer_norm"]
    outcomes = [(n, "failed", "x=1, but should be 2") for n in own["failing"]] + [(n, "passed", "") for n in own["held"]]
    lines = likely_bugs([("norms.rms_norm_known_values", "error", "y[0]=nan, but should be finite", {"check": "finite"}), *outcomes])
    assert lines[0] == "non-finite answers (NaN or inf) in 1 failure(s), first in norms.rms_norm_known_values: y[0]=nan, but should be finite"
    assert lines[1] == f"likely bug: norms.layer_norm_known_values: {REGISTRY['norms.layer_norm_known_values'].hint}", lines
    assert all(line.startswith("  ") for line in lines[2:]), lines
    assert likely_bugs(iter(outcomes)) == likely_bugs(outcomes)  # the gate passes a generator
    shown = [o for o in outcomes if not o[0].startswith("block.")]  # the block's invariants hidden: no line may name them
    assert not [line for line in likely_bugs(shown) if "block." in line]
    assert likely_bugs([(n, "passed", "") for n in own["held"]]) == [] and likely_bugs([(n, "skipped", "") for n in own["failing"]]) == []


def test_non_finite_answers_are_named_once_in_order():
    failures = [("norms.a", "x[0]=nan [f]", {"check": "finite"}), ("block.b", "y=1", {"check": "value"}),
                ("model.c", "z[1]=inf", {"check": "finite"})]
    assert [name for name, _ in non_finite_first(failures)] == ["norms.a", "model.c"]


def test_leave_one_out_accuracy_is_measured_and_beats_the_first_failure():
    accuracy, misses = leave_one_out_accuracy(SIGNATURES)
    order = {name: i for i, name in enumerate(REGISTRY)}
    first_failure = sum(min(s["failing"], key=order.get) == s["killed_by"] for s in SIGNATURES.values()) / len(SIGNATURES)
    assert accuracy > first_failure, (accuracy, first_failure)
    assert len(misses) == round((1 - accuracy) * len(SIGNATURES))
    # A bug only a symptom law names (a wrong shape, NaN: diagnosis.SYMPTOMS) is ranked after every failing law of a component, by
    # design, so issue 10's 90% is over the bugs a component's law can name; the others' figure is in docs/power.md.
    by_symptom = {name for name, s in SIGNATURES.items() if all(n.split(".")[0] in SYMPTOMS for n in named_by(s))}
    missed = [m for m in misses if m[0] not in by_symptom]
    share = 1 - len(missed) / (len(SIGNATURES) - len(by_symptom))
    assert 0 < len(by_symptom) < 8 and share >= 0.9, f"leave-one-out diagnosis fell to {share:.1%} (issue 10 asks for 90%): {missed}"


def test_the_held_out_outcomes_are_those_of_the_held_out_and_documented_bugs():
    """tests/fixtures/heldout_outcomes*.json are rewritten (python -m tests.heldout_bugs [--second]) when a bug is added to a set;
    each failure carries its figures (the runner's measured_of), which the likely-bug line reads."""
    from heldout_bugs import HELD_OUT, OUTCOMES
    from heldout_bugs_2 import HELD_OUT_2, OUTCOMES_2
    from heldout_bugs_3 import HELD_OUT_3, OUTCOMES_3

    from invariants.mutants.documented import documented_mutants

    first, second, third = (json.loads(path.read_text()) for path in (OUTCOMES, OUTCOMES_2, OUTCOMES_3))
    assert set(first) == set(HELD_OUT) | {m.name for m in documented_mutants()} and set(second) == set(HELD_OUT_2) and set(third) == set(HELD_OUT_3)
    assert all(len(row) == 4 and isinstance(row[3], dict) for rows in (*first.values(), *second.values(), *third.values()) for row in rows)


def test_the_likely_bug_line_names_bugs_its_hints_were_not_written_for():
    """Measured on bugs held out of the tuning (issue 26 §4, issue 35 §2): the first cause the line names is the bug's, in how many
    kinds of bug the line lists; the documented bugs by the invariants that name them. Recorded as measured, not tuned back
    (the figures, before and after, are in docs)."""
    from heldout_bugs import figures

    measured = figures()
    assert measured["held_out"][0] >= 7 and measured["held_out_2"][0] >= 10, measured  # of 9 and of 13: the first cause named is the bug
    # kinds of bug listed per line; set 2's rose from 2.08 to 2.15 when the agreement hints of the Llama block and model also
    # named a float16 RMSNorm (0c95a09): two of its lines list that cause after the first
    assert measured["held_out"][2] <= 2.4 and measured["held_out_2"][2] <= 2.2, measured
    assert measured["documented"][:2] >= (12, 22) and measured["documented_component"] >= (20, 22), measured


def test_the_eps_and_precision_bugs_of_the_third_held_out_set_are_named_by_their_first_cause():
    """tests/heldout_bugs_3.py, written before the rule that tells an eps bug from float32 rounding (issue 37): measured, not tuned back."""
    from heldout_bugs_3 import figures_3

    assert figures_3()[0] >= 3, figures_3()  # of 4: the LayerNorm eps bug of a GPT block is named by another hint


def _line(outcomes):
    """The likely-bug line of these outcomes."""
    return next(line for line in likely_bugs(outcomes) if line.startswith("likely bug:"))


REFUSED = "llama_decode refused chunks=[6] at window=2 (llama_decode raised ValueError: prefill too long): if it takes no such split, declare"
RAISED = {"raised": True}  # invariants.runner.measured_of's figures of an ImplementationError
CLOSE = {"check": "close", "dtype": "float64"}


def test_a_refused_call_is_reported_as_a_refusal_not_as_the_first_law_it_stopped():
    raised = ("dtypes.llama_decode_keeps_dtype", "error", "llama_decode raised ValueError: prefill too long", RAISED)
    outcomes = [("decoding.cache_size_law", "error", REFUSED, {**RAISED, "refused": True}), raised, ("llama.residual_identity", "passed", "")]
    assert _line(outcomes) == f"likely bug: decoding.cache_size_law: it refused an input instead of answering: {REFUSED}"
    crash = ("block.residual_identity", "error", "transformer_block raised ValueError: x", RAISED)
    downstream = [("norms.layer_norm_known_values", "failed", "y=1, but should be 2", {"check": "value"}), crash]
    assert _line(downstream).endswith(REGISTRY["norms.layer_norm_known_values"].hint)  # an exception above a wrong answer is not the news
    hint = REGISTRY["course.batches_shift_by_one"].hint
    raised = ("course.batches_shift_by_one", "error", "get_batch raised ValueError: high <= 0", RAISED)
    assert _line([raised]) == f"likely bug: course.batches_shift_by_one: it raised instead of answering ({raised[2]}); {hint}"
    assert "refused" not in _line([(*outcomes[0][:3], {}), raised])  # the words "refused chunks=" without the figure are no refusal


def test_errors_of_float32_size_in_a_float64_run_are_named_as_such_unless_a_law_misses_by_more():
    tight = {**CLOSE, "atol": 4e-07, "rtol": 4e-07, "float32_units": 60.0}
    rounded = [("rope.pairing_anchor", "failed", "", tight),
               ("llama.block_agrees_with_reference", "failed", "", {**CLOSE, "atol": 5e-10, "rtol": 1e-10, "float32_sized": True})]
    assert "float32 rounding size in a float64 run" in _line(rounded) and "COMPUTE_DTYPE = 'float32'" in _line(rounded)
    loose = ("llama.values_are_not_rotated", "failed", "", {**CLOSE, "atol": 6.7e-06, "rtol": 8e-07, "float32_units": 5e4})
    assert "float32 rounding" not in _line([*rounded, loose])  # larger than float32 rounds
    assert "float32 rounding" not in _line([rounded[1], ("rope.pairing_anchor", "failed", "", {**tight, "float32_units": 900.0})])
    assert "float32 rounding" not in _line([("llama.block_agrees_with_reference", "failed", "", {**CLOSE, "atol": 5e-10, "rtol": 1e-10})])
    measured = [("llama.block_agrees_with_reference", "failed", "", {**CLOSE, "atol": 5e-10, "rtol": 1e-10, "float32_units": 40.0})]
    assert "float32 rounding size" in _line(measured)  # an error of 40 float32 roundings, measured by the assertion itself
    half = [("llama.block_agrees_with_reference", "failed", "", {**CLOSE, "float32_units": 3e3}), ("llama.logits_agree_with_reference",
                                                                                                    "failed", "", {**CLOSE, "float32_units": 2e4})]
    assert "computes in float16 or bfloat16" in _line(half)


def test_a_bug_that_needs_a_window_in_every_failing_example_is_named_a_window_bug():
    laws = [("llama.values_are_not_rotated", "failed", "", {"windows": [1]}), ("llama.block_agrees_with_reference", "failed", "", {"windows": [3]})]
    assert "every failing example has a sliding window (window=1, 3)" in _line(laws)
    unwindowed = [laws[0], ("llama.block_agrees_with_reference", "failed", "", {"windows": [None]})]
    assert _line(unwindowed) == f"likely bug: llama.values_are_not_rotated: {REGISTRY['llama.values_are_not_rotated'].hint}"


def _rms(x, eps, dtype=np.float64):
    """RMSNorm of x's rows, computed in dtype."""
    rows = x.astype(dtype)
    return (rows / np.sqrt((rows * rows).mean(axis=-1, keepdims=True) + dtype(eps))).astype(np.float64)


@pytest.mark.parametrize(("norm", "grows"), [
    (lambda x, eps: x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + eps), True),  # tests/heldout_bugs.py's rms_eps_outside_root
    (lambda x, eps: _rms(x, 0.0), True),  # eps dropped
    (lambda x, eps: _rms(x, eps, np.float32), False),  # correct, in float32
    (lambda x, eps: _rms(x, eps, np.float16), False),  # correct, in float16
])
def test_the_eps_probe_tells_a_misplaced_eps_from_rounding(norm, grows):
    """An error of eps's making grows as a row's mean square nears eps; rounding's is the same at every power-of-two scale."""
    from invariants.diagnosis import EPS_GROWTH, _eps_growth
    from invariants.laws.norms import errors_far_from_and_near_eps

    eps, rows = 1e-5, np.random.default_rng(0).normal(size=(3, 1, 8)) * [[[1.0]], [[3.0]], [[0.2]]]  # (B, 1, d)
    figures = errors_far_from_and_near_eps(lambda x: (norm(x, eps), _rms(x, eps)), rows, eps)
    assert bool(_eps_growth(figures)) == grows, figures
    assert not grows or _eps_growth(figures) >= 4 * EPS_GROWTH, figures


def test_a_norm_error_that_grows_near_eps_is_named_an_eps_bug_and_not_float32_rounding():
    """heldout.rms_eps_outside_root's figures (tests/fixtures/heldout_outcomes.json): every error a few dozen float32 roundings,
    which alone reads as float32 arithmetic; the block's norm, probed nearer eps, errs 1,000 times more."""
    sized = {**CLOSE, "atol": 5e-10, "rtol": 1e-10, "float32_units": 33.7, "float32_sized": True}
    seen_alone = {**CLOSE, "atol": 5.8e-06, "rtol": 8e-07, "float32_units": 25.6}
    outcomes = [("llama.block_norm_seen_alone", "failed", "", seen_alone), ("llama.block_agrees_with_reference", "failed", "", sized)]
    assert "float32 rounding size" in _line(outcomes)  # without the probe's figures
    probed = {**seen_alone, "norm_error_far": 5e-6, "norm_error_near": 7e-3}
    line = _line([("llama.block_norm_seen_alone", "failed", "", probed), outcomes[1]])
    assert "eps is not inside the root" in line and "grows 1,400-fold" in line and "float32" not in line, line
    assert "turns to NaN" in _line([("llama.block_norm_seen_alone", "failed", "", {**probed, "norm_error_near": "nan"}), outcomes[1]])
    flat = {**seen_alone, "norm_error_far": 3e-8, "norm_error_near": 4e-8}  # rounding: no larger near eps
    assert "float32 rounding size" in _line([("llama.block_norm_seen_alone", "failed", "", flat), outcomes[1]])


def test_a_wrong_shape_or_nan_under_a_hint_about_neither_is_said_instead_of_the_hint():
    shape = "shape of gqa_attention output=(1, 2, 3, 4), but should be (1, 4, 3, 4) [gqa_attention(q, k, v)]"
    assert _line([("gqa.repeated_kv_heads", "failed", shape, {"check": "shape"})]) == (
        f"likely bug: gqa.repeated_kv_heads: its answer has the wrong shape, which its hint is not about: {shape}")
    nan = "gqa_attention weights[0, 0, 0, 0]=nan, but should be finite [gqa_attention(q, k, v)]"
    assert "holds NaN or inf, which its hint is not about" in _line([("gqa.repeated_kv_heads", "failed", nan, {"check": "finite"})])
    named = REGISTRY["attention.large_scores_stay_finite"].hint  # a hint about overflow keeps its place over NaN
    assert _line([("attention.large_scores_stay_finite", "failed", "out[0]=nan, but should be finite", {"check": "finite"})]).endswith(named)


@pytest.mark.parametrize(("failure", "said"), [
    (("masking.window_key_count", {"check": "condition", "keys_seen": 3, "keys_expected": 2, "window": 2, "query": 4}),
     "the sliding window is one key too wide (j >= p - w keeps w + 1 keys): the query at 4 saw 3 keys where window=2 gives it 2"),
    (("masking.window_key_count", {"check": "condition", "keys_seen": 1, "keys_expected": 2, "window": 2, "query": 4}),
     "the sliding window is one key too narrow"),
    (("masking.window_key_count", {"check": "condition", "keys_seen": 3, "keys_expected": 2, "keys_after": 2, "window_keys_hidden": 0,
                                   "window": 3, "query": 1}), "the causal mask does not hide the future: the query at 1 saw 2 key(s)"),
    (("masking.window_key_count", {"check": "condition", "keys_seen": 2, "keys_expected": 1, "keys_after": 2, "window_keys_hidden": 1,
                                   "window": 3, "query": 0}), "the causal mask is on the wrong side of the diagonal"),
    (("attention.causal_weights_pattern", {"check": "condition", "zero_share_above": 0.0, "zero_share_below": 1.0}),
     "the causal mask is on the wrong side of the diagonal"),
    (("attention.weights_are_distributions", {**CLOSE, "columns_sum_to_one": True}), "the softmax normalises over the query axis"),
    (("llama.logits_agree_with_reference", {**CLOSE, "float32_units": 1e6, "agrees_pre_norm": True}), "the final RMSNorm is missing"),
    (("decoding.decode_matches_full_forward", {**CLOSE, "float32_units": 1e6, "first_position": 3, "chunk_starts": [0, 3], "window": None}),
     "first disagrees at position 3, in a decode step: a decode step's tokens are not at past_length + i"),
    (("decoding.decode_matches_full_forward", {**CLOSE, "float32_units": 1e6, "first_position": 5, "chunk_starts": [0, 3, 4, 5], "window": 4}),
     "once the window (4) is full"),
])
def test_a_figure_of_the_counterexample_names_one_cause_and_no_other(failure, said):
    """Each measured rule: the line says the one cause the figure shows, and lists no other candidate."""
    name, measured = failure
    lines = likely_bugs([(name, "failed", "whatever the words", measured), ("llama.residual_identity", "failed", "", {})])
    assert said in next(line for line in lines if line.startswith("likely bug:")), lines
    assert not [line for line in lines if "next most likely" in line], lines


def test_the_norm_and_value_bias_laws_tell_the_five_block_bugs_apart():
    """The block's norm seen alone fails the three norm bugs of tests/heldout_bugs.py and not the two bias bugs; b_v alone, the reverse."""
    from heldout_bugs import HELD_OUT

    from invariants.profiles import profile_settings

    laws = ("llama.block_norm_seen_alone", "llama.value_bias_reaches_values")
    expected = {"rms_eps_outside_root": "failed passed", "rms_one_plus_gain": "failed passed", "rms_centred": "failed passed",
                "qkv_biases_dropped": "passed failed", "key_bias_on_values": "passed failed"}
    with np.errstate(all="ignore"):
        for slug, statuses in expected.items():
            impl = HELD_OUT[f"heldout.{slug}"].implementation()
            assert " ".join(run_invariant(REGISTRY[law], impl, settings=profile_settings("ci")).status for law in laws) == statuses, slug


def test_a_block_whose_parts_hold_is_said_to_combine_them_wrongly():
    """A block law failing while its parts' laws hold: what can be said besides the hint is that the parts are sound."""
    parts = [(f"{c}.{law}", "passed", "") for c, law in [("norms", "rms_norm_scale_law"), ("rope", "relative_offsets"), ("gqa", "head_groups"),
                                                         ("masking", "window_key_count"), ("swiglu", "linear_in_up")]]
    failing = [("llama.values_are_not_rotated", "failed", "out of tolerance [llama_block(x, params, window=None)]")]
    assert ("  its parts hold (norms, rope, gqa, masking, swiglu: every law of theirs that ran passed), so the bug is in how llama "
            "combines them") in likely_bugs(failing + parts)
    assert not [line for line in likely_bugs(failing + parts[1:]) if "its parts hold" in line]  # norms not seen: nothing said
