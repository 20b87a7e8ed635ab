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
REFERENCE_SHORTCUTS = {"llama_logits": {"llama_decode"}, "cross_attention": {"gqa_attention"}}


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
    lines = likely_bugs([("norms.rms_norm_known_values", "error", "y[0]=nan, but should be finite"), *outcomes])
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
    """tests/fixtures/heldout_outcomes.json is rewritten (python -m tests.heldout_bugs) when a bug is added to either set."""
    from heldout_bugs import HELD_OUT, OUTCOMES

    from invariants.mutants.documented import documented_mutants

    assert set(json.loads(OUTCOMES.read_text())) == set(HELD_OUT) | {m.name for m in documented_mutants()}


def test_the_likely_bug_line_names_bugs_its_hints_were_not_written_for():
    """Measured on bugs held out of the tuning (issue 26 §4): the new decoder bugs, and the documented bugs by the invariants that name them."""
    from heldout_bugs import figures

    measured = figures(likely_bugs)
    # documented: 13 of 22 on the signatures of 759830a, 12 of 22 on those regenerated with the laws over the table (one bug's
    # ranking moved with the zoo's data, not with a rule; docs/power.md): held out, so recorded as measured, not tuned back
    assert measured["held_out"] >= 9 / 9 and measured["documented"] >= 12 / 22 and measured["documented_component"] >= 20 / 22, measured


def _line(outcomes):
    """The likely-bug line of these outcomes."""
    return next(line for line in likely_bugs(outcomes) if line.startswith("likely bug:"))


REFUSED = "llama_decode refused chunks=[6] at window=2 (llama_decode raised ValueError: prefill too long): if it takes no such split, declare"


def test_a_refused_call_is_reported_as_a_refusal_not_as_the_first_law_it_stopped():
    raised = ("dtypes.llama_decode_keeps_dtype", "error", "llama_decode raised ValueError: prefill too long")
    outcomes = [("decoding.cache_size_law", "error", REFUSED), raised, ("llama.residual_identity", "passed", "")]
    assert _line(outcomes) == f"likely bug: decoding.cache_size_law: it refused an input instead of answering: {REFUSED}"
    crash = ("block.residual_identity", "error", "transformer_block raised ValueError: x")
    downstream = [("norms.layer_norm_known_values", "failed", "y=1, but should be 2"), crash]
    assert _line(downstream).endswith(REGISTRY["norms.layer_norm_known_values"].hint)  # an exception above a wrong answer is not the news
    hint = REGISTRY["course.batches_shift_by_one"].hint
    raised = ("course.batches_shift_by_one", "error", "get_batch raised ValueError: high <= 0")
    assert _line([raised]) == f"likely bug: course.batches_shift_by_one: it raised instead of answering ({raised[2]}); {hint}"


def _agreement(note=""):
    tolerance = "atol=5e-10 + rtol=1e-10·|expected| (float64)"
    return f"llama_block output (held to the half_split pairing{note})=values out of tolerance, but should be close within {tolerance}"


F32 = "; its errors are of float32 rounding size, not a convention's: code that computes in float32 by design declares COMPUTE_DTYPE = 'float32'"


def test_errors_of_float32_size_in_a_float64_run_are_named_as_such_unless_a_law_misses_by_more():
    tight = "rope(e_a)=values out of tolerance, but should be close within atol=4e-07 + rtol=4e-07·|expected| (float64)"
    loose = "llama_block output=values out of tolerance, but should be close within atol=6.7e-06 + rtol=8e-07·|expected| (float64)"
    rounded = [("rope.pairing_anchor", "failed", tight), ("llama.block_agrees_with_reference", "failed", _agreement(F32))]
    assert "float32 rounding size in a float64 run" in _line(rounded) and "COMPUTE_DTYPE = 'float32'" in _line(rounded)
    assert "float32 rounding" not in _line([*rounded, ("llama.values_are_not_rotated", "failed", loose)])  # larger than float32 rounds
    assert "float32 rounding" not in _line([("llama.block_agrees_with_reference", "failed", _agreement())])


def test_a_bug_that_needs_a_window_in_every_failing_example_is_named_a_window_bug():
    laws = [("llama.values_are_not_rotated", "failed", "out of tolerance [llama_block(x, params, window=1) with W_q = 0]"),
            ("llama.block_agrees_with_reference", "failed", "out of tolerance [llama_block(x, params, window=3)]")]
    assert "every failing example has a sliding window (window=1, 3)" in _line(laws)
    unwindowed = [laws[0], ("llama.block_agrees_with_reference", "failed", "out of tolerance [llama_block(x, params, window=None)]")]
    assert _line(unwindowed) == f"likely bug: llama.values_are_not_rotated: {REGISTRY['llama.values_are_not_rotated'].hint}"


def test_a_wrong_shape_or_nan_under_a_hint_about_neither_is_said_instead_of_the_hint():
    shape = "shape of gqa_attention output=(1, 2, 3, 4), but should be (1, 4, 3, 4) [gqa_attention(q, k, v)]"
    assert _line([("gqa.repeated_kv_heads", "failed", shape)]) == (
        f"likely bug: gqa.repeated_kv_heads: its answer has the wrong shape, which its hint is not about: {shape}")
    nan = "gqa_attention weights[0, 0, 0, 0]=nan, but should be finite [gqa_attention(q, k, v)]"
    assert "holds NaN or inf, which its hint is not about" in _line([("gqa.repeated_kv_heads", "failed", nan)])
    named = REGISTRY["attention.large_scores_stay_finite"].hint  # a hint about overflow keeps its place over NaN
    assert _line([("attention.large_scores_stay_finite", "failed", "out[0]=nan, but should be finite")]).endswith(named)


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
