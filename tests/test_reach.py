"""The suite reaches where shipped bugs live, at the ci profile: long sequences, scores of 1e4, 16-bit dtypes, degenerate rows.

Each test runs invariants at the ci profile (60 examples, derandomized) on the reference wrapped so
that it records what it was called with, and checks that the inputs the bugs need were among them.
"""

import numpy as np
import pytest

import invariants.reference.numpy as ref
from invariants import REGISTRY, Implementation, all_invariants, load_implementation, run_invariant
from invariants.mutants import MUTANTS, all_mutants
from invariants.profiles import profile_settings
from invariants.strategies.core import EITHER_SIDE, GRID, TILE_LENGTHS

all_invariants()
all_mutants()
CI = profile_settings("ci")

# Every invariant about the causal mask, and the function whose calls show the lengths it reached.
CAUSAL = {
    "attention.causal_non_leakage": "attention",
    "attention.causal_gradient": "attention",
    "attention.causal_weights_pattern": "attention",
    "attention.last_position_mask_free": "attention",
    "block.causal_non_leakage": "transformer_block",
    "model.causal_non_leakage": "gpt_logits",
    "model.prefix_consistency": "gpt_logits",
}
EXACT_AT_LARGE_SCORES = ("attention.causal_non_leakage", "attention.causal_weights_pattern", "attention.large_scores_stay_finite",
                         "attention.zero_output_projection", "attention.batch_items_independent")


def _recorded(backend, dtype, name, record):
    """An Implementation of the reference's `name` (and what it needs) that passes each call's arguments to record first."""
    module = load_implementation(f"reference.{backend}", dtype=dtype).namespace
    original = getattr(module, name)

    def recording(*args):
        record(*args)
        return original(*args)

    needed = {"transformer_block", "gpt_logits", "attention", "layer_norm", "feed_forward"}
    functions = {f: getattr(module, f) for f in needed}
    functions[name] = recording
    return Implementation.from_functions(backend=backend, dtype=dtype, label=f"recording reference.{backend}", **functions)


def _length(name, args):
    x = args[0]
    return int(x.shape[1])  # attention and the block: x (B, T, d); the model: ids (B, T)


@pytest.mark.parametrize("name, function", CAUSAL.items(), ids=list(CAUSAL))
def test_every_causal_invariant_meets_every_length_either_side_of_each_tile_at_ci(name, function):
    inv = REGISTRY[name]
    backend = inv.backends[-1] if "numpy" not in inv.backends else "numpy"
    seen = set()
    impl = _recorded(backend, "float64", function, lambda *args: seen.add(_length(function, args)))
    assert run_invariant(inv, impl, settings=CI).passed
    missing = sorted(set(EITHER_SIDE) - seen)
    assert not missing, f"{name} at ci never ran at lengths {missing} (it ran at {sorted(seen)})"
    assert max(seen) >= 128 and {t - 1 for t in TILE_LENGTHS} | {t + 1 for t in TILE_LENGTHS} <= seen


def _largest_score(x, W_q, W_k, n_heads):
    B, T, d = np.asarray(x).shape
    D = d // n_heads
    q = (np.asarray(x, dtype=np.float64) @ np.asarray(W_q, dtype=np.float64)).reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)
    k = (np.asarray(x, dtype=np.float64) @ np.asarray(W_k, dtype=np.float64)).reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)
    return float(np.abs(q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)).max(initial=0.0))


@pytest.mark.parametrize("name", EXACT_AT_LARGE_SCORES)
def test_the_exact_attention_laws_meet_scores_of_1e4_at_ci_with_finite_inputs(name):
    scores = []
    impl = _recorded("numpy", "float64", "attention", lambda x, W_q, W_k, W_v, W_o, H, causal: scores.append(_largest_score(x, W_q, W_k, H)))
    assert run_invariant(REGISTRY[name], impl, settings=CI).passed
    assert max(scores) >= 1e4, f"{name}: the largest score at ci is {max(scores):.4g}"
    assert sum(s >= 1e3 for s in scores) >= 10, f"{name}: only {sum(s >= 1e3 for s in scores)} calls with scores above 1e3"


def test_large_scores_stay_finite_in_float16():
    import torch  # noqa: F401 - the torch reference in float16

    largest = []

    def record(x, W_q, W_k, W_v, W_o, H, causal):
        largest.append(_largest_score(x.double().numpy(), W_q.double().numpy(), W_k.double().numpy(), H))
        assert all(np.isfinite(t.double().numpy()).all() for t in (x, W_q, W_k, W_v, W_o))

    impl = _recorded("torch", "float16", "attention", record)
    for name in EXACT_AT_LARGE_SCORES:
        assert run_invariant(REGISTRY[name], impl, settings=CI).passed, name
    assert 1e3 <= max(largest) < 65504 / 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["norms.layer_norm_large_rows", "norms.rms_norm_large_rows", "attention.large_scores_stay_finite",
                                  "attention.causal_non_leakage", "attention.causal_weights_pattern", "block.shape_preserved"])
def test_the_reach_invariants_hold_on_the_torch_reference_in_16_bits(name, dtype):
    outcome = run_invariant(REGISTRY[name], load_implementation("reference.torch", dtype=dtype), settings=CI)
    assert outcome.passed, outcome.report


def test_large_norm_rows_pass_the_float16_overflow_point():
    rows = []
    impl = Implementation.from_functions(backend="numpy", rms_norm=lambda x, g, eps: rows.append(np.abs(x).max()) or ref.rms_norm(x, g, eps))
    assert run_invariant(REGISTRY["norms.rms_norm_large_rows"], impl, settings=CI).passed
    assert min(rows) >= 32 and max(rows) >= 256 * 8  # x² > 65504 from |x| = 256 on


# -- degenerate rows, drawn on purpose ---------------------------------------------------------


def test_attention_meets_degenerate_rows_at_ci():
    seen = set()

    def record(x, W_q, W_k, W_v, W_o, H, causal):
        if x.shape[1] == 1:
            seen.add("one-token sequence")
        if (x == 0).all(axis=-1).any() and (x != 0).any():
            seen.add("all-zero tokens among others")
        if x.shape[1] > 1 and (x == x[:, :1]).all() and (x != 0).any():
            seen.add("one token repeated")
        if not W_q.any() and x.any() and W_k.any():
            seen.add("all-equal scores")

    impl = _recorded("numpy", "float64", "attention", record)
    for name in ("attention.causal_weights_pattern", "attention.agrees_with_reference", "attention.weights_are_distributions"):
        assert run_invariant(REGISTRY[name], impl, settings=CI).passed
    assert seen == {"one-token sequence", "all-zero tokens among others", "one token repeated", "all-equal scores"}, seen


def test_norms_meet_rows_of_zeros_at_ci():
    zero_rows = []
    impl = Implementation.from_functions(
        backend="numpy", layer_norm=lambda x, g, b, eps: zero_rows.append(bool((x == 0).all(axis=-1).any())) or ref.layer_norm(x, g, b, eps))
    assert run_invariant(REGISTRY["norms.layer_norm_agrees_with_reference"], impl, settings=CI).passed
    assert sum(zero_rows) >= 5


def test_moe_meets_fully_tied_router_scores_at_ci():
    tied = []
    impl = Implementation.from_functions(
        backend="numpy", top_k_gates=lambda r, k: tied.append(r.shape[-1] > 1 and bool((r == r[:, :1]).all())) or ref.top_k_gates(r, k))
    assert run_invariant(REGISTRY["moe.top_k_gates_tie_rule"], impl, settings=CI).passed
    assert sum(tied) >= 3


# -- the bugs that live there are killed, each by an invariant whose hint names it ------------------------------

REACH_MUTANTS = {  # mutant: words its killing invariant's hint must contain
    "attention.mask_buffer_for_64_tokens": "block size",
    "attention.tiles_of_16_masked_on_the_diagonal_only": "tiles",
    "attention.tiles_of_128_masked_on_the_diagonal_only": "tiles",
    "attention.additive_mask_of_minus_1e4": "-1e4",
    "attention.future_filled_with_minus_1e4": "-1e4",
    "attention.softmax_without_max_in_attention": "max",
    "attention.mask_buffer_for_32_tokens_torch": "block size",
    "attention.scores_in_float16_torch": "float16",
    "softmax.softmax_masked_to_minus_1e4": "-1e4",
    "softmax.softmax_in_float16": "float16",
    "norms.rms_norm_squares_in_float16": "float16",
    "norms.layer_norm_variance_in_float16": "float16",
    "block.block_mask_buffer_for_32_tokens": "block size",
    "model.model_mask_buffer_for_64_tokens": "block size",
    "dtypes.np_sqrt_scaled_attention": "np.sqrt(D), a numpy float64 scalar",  # float32 in, float64 out: invariants/laws/dtypes.py
}


@pytest.mark.parametrize("name, words", REACH_MUTANTS.items(), ids=list(REACH_MUTANTS))
def test_each_reach_bug_is_killed_at_ci_by_an_invariant_whose_hint_names_it(name, words):
    mutant = MUTANTS[name]
    inv = REGISTRY[mutant.killed_by]
    assert words in inv.hint, f"{inv.name}'s hint does not mention {words!r}"
    outcome = run_invariant(inv, mutant.implementation(), settings=CI, shrink_limit=20)
    assert outcome.status in ("failed", "error") and not outcome.check_crashed, f"{name} survived: {outcome.reason}"


def test_the_long_sequence_bugs_pass_at_the_old_lengths():
    """Without the long sequences nothing kills them: each is right up to 8 tokens (so its kill is the reach's doing)."""
    x = np.random.default_rng(0).standard_normal((2, 8, 4))
    W = [np.random.default_rng(i).standard_normal((4, 4)) for i in range(4)]
    for name in ("attention.mask_buffer_for_64_tokens", "attention.tiles_of_16_masked_on_the_diagonal_only",
                 "attention.tiles_of_128_masked_on_the_diagonal_only", "block.block_mask_buffer_for_32_tokens"):
        out, weights = MUTANTS[name].function(x, *W, 2, True)
        expected_out, expected_weights = ref.attention(x, *W, 2, True)
        assert np.array_equal(out, expected_out) and np.array_equal(weights, expected_weights), name


# -- values shrink towards simple numbers ------------------------------------------------------


def test_a_shrunk_attention_leak_reads_in_simple_numbers():
    outcome = run_invariant(REGISTRY["attention.causal_non_leakage"], MUTANTS["attention.mask_after_softmax"].implementation(), settings=CI)
    assert outcome.status == "failed"
    inputs = dict(outcome.example)["inputs"]
    assert inputs.startswith("{x: float64 (1, 2, 1) ["), inputs
    numbers = [float(v) for v in inputs.replace("[", " ").replace("]", " ").replace(",", " ").split() if v.lstrip("-").replace(".", "").isdigit()]
    assert numbers and all(v in (-1.0, -0.5, 0.0, 0.5, 1.0, 2.0) for v in numbers), inputs


def test_grid_values_are_exact_in_bfloat16_and_shrink_towards_zero_and_one():
    torch = pytest.importorskip("torch")
    assert GRID[0] == 0 and GRID[2] == 1 and GRID[3] == -1 and GRID[4] == 0.5
    assert np.array_equal(torch.tensor(GRID * 2.0**-7).to(torch.bfloat16).double().numpy(), GRID * 2.0**-7)
    assert 0.95 < GRID.std() < 1.05
