"""Invariants of gpt_logits: causality, prefixes, the tied output, the final norm, positions, refusals, the reference.

Models are drawn with what the implementation declares (invariants/conventions.py): attention
biases only under ATTENTION_BIASES = True, blocks of width FEED_FORWARD_RATIO·d (else 4·d); the
reference and the final norm's expected values use its LAYER_NORM_EPS (else 1e-5) and GELU_FORM
(else either form, one for the whole model).

causal_non_leakage and prefix_consistency draw, half the time, a model of 65 or 129
positions at d_model <= 8 and run at every length either side of 16, 32, 64 and 128 up to it: a
mask right only up to a block size or a tile length shows on one side of it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape, assert_value
from invariants.conventions import attention_biases, biases_as_declared, declared, layer_norm_eps
from invariants.inputs import valid_inputs
from invariants.laws.block import norms_row_conditions, silenced
from invariants.laws.reference_check import assert_agrees_with_reference
from invariants.protocol import ImplementationError
from invariants.registry import invariant
from invariants.strategies.core import MAX_LONG_WIDTH, SWEPT_LENGTHS, float_arrays, integers, none, one_of, sampled_from, swept_lengths
from invariants.strategies.norms import loud_rows
from invariants.strategies.params import gpt_configs, gpt_params, token_ids
from invariants.tolerance import layer_norm_row_conditions

LESSON = 70  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("gpt_logits",)  # the protocol functions whose laws it holds


def configs_for(impl, **options):
    """gpt_configs(**options) of models impl can run: attention biases only if it declares them, its feed-forward ratio."""
    return gpt_configs(attn_bias=attention_biases(impl), ff_ratio=declared(impl, "FEED_FORWARD_RATIO") or 4, **options)


@valid_inputs("gpt_logits")
def gpt_logits_arguments(impl, case):
    """Token ids no longer than the context and one-layer GPT weights with the biases as declared."""
    sizes = dict(max_vocab=6, max_max_len=4, max_layers=1, max_heads=2, max_d_head=3)
    config = case.draw(gpt_configs(**sizes, attn_bias=attention_biases(impl)), "config")
    params = case.draw(biases_as_declared(impl, gpt_params(config)), "params")
    return case.draw(token_ids(config.vocab, max_batch=2, max_seq=config.max_len), "ids"), params, config.n_heads


def _model_case(impl, case, *, min_seq=1, spare_positions=0, wide=False, long_lengths=()):
    """Draw a config, its params and ids (B, T) with T <= max_len - spare_positions; wide=True keeps d_model and vocab >= 8.

    long_lengths: half the time, a model of exactly that many positions (drawn from them) at d_model <= 8, and ids of that length.
    """
    widths = dict(min_heads=2, min_d_head=4, min_vocab=8) if wide else {}
    long = case.draw(one_of(none(), sampled_from(long_lengths)), "long sequence") if long_lengths else None
    if long is None:
        config = case.draw(configs_for(impl, min_max_len=min_seq + spare_positions, **widths), "config")
        min_ids, max_ids = min_seq, config.max_len - spare_positions
    else:
        narrow = dict(max_heads=2, max_d_head=4) if wide else dict(max_heads=2, max_d_head=MAX_LONG_WIDTH // 2)
        positions = long + spare_positions
        config = case.draw(configs_for(impl, min_max_len=positions, max_max_len=positions, **widths, **narrow), "config")
        min_ids = max_ids = long
    # positions' rows past 256 in float16 (loud_rows): wte is the tied head too, and loud logits would overflow a correct model
    params = case.draw(loud_rows(biases_as_declared(impl, gpt_params(config)), impl.dtype, part="wpe"), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=2, min_seq=min_ids, max_seq=max_ids), "ids")
    return config, params, ids


def _logits(impl, config, ids, params, call):
    """impl.gpt_logits(ids, params, n_heads), checked to be (B, T, V)."""
    return assert_shape(impl.gpt_logits(ids, params, config.n_heads), (*ids.shape, config.vocab), "logits", call)


def prefix_conditions(impl, ids, params, n_heads):
    """(T,): entry t - 1 is the worst layer_norm_condition of the model's norm inputs (each block's two and the final
    norm's, in float64) on ids[:, :t], for every t at once: the model is causal, so a prefix's rows are the full run's
    (to float64 rounding)."""
    eps = layer_norm_eps(impl)
    wte, wpe, blocks = impl.as_seen((params["wte"], params["wpe"], params["blocks"]))
    x = wte[ids] + wpe[: ids.shape[1]]  # (B, T, d)
    worst = np.ones(ids.shape)  # (B, T)
    for block in blocks:
        worst = np.maximum(worst, norms_row_conditions(impl, x, block, n_heads, True))
        x = ref.transformer_block(x, block, n_heads, True, eps=eps)
    return np.maximum.accumulate(np.maximum(worst, layer_norm_row_conditions(x, eps)).max(axis=0))


def _head_tolerance(impl, h, wte):
    """The dtype tolerance for logits h·wteᵀ, with room for the head's one matmul.

    A dot product's rounding error is relative to the sum of its terms' sizes Σ|h_i·w_i|, not to its
    value, which cancellation can make small (with 2 logits both can be, and a norm-wise tolerance
    relative to the largest logit is then tighter than the arithmetic allows).
    """
    return impl.tolerance.at_scale(float((np.abs(h) @ np.abs(wte).T).max()))  # (..., d) x (d, V) -> (..., V)


@invariant(
    requires=("gpt_logits",),
    hint="the blocks run without the causal mask (causal=False passed, or the mask built for the wrong positions or "
         "only up to some length: a buffer for a fixed block size, a kernel masking only within its tiles, see the "
         "length in the call): a token's logits may not see the tokens after it",
)
def causal_non_leakage(impl, case):
    """Logits at positions < j do not depend on the ids at positions >= j: changing those leaves them exactly equal.

    Drawn at lengths up to 129: a long draw runs at every length either side of 16, 32, 64 and 128 up to it.
    """
    config, params, ids = _model_case(impl, case, min_seq=2, long_lengths=SWEPT_LENGTHS)
    drawn_j = case.draw(integers(1, ids.shape[1] - 1), "j (first changed position; at most T - 1 at each length T)")
    shift = case.draw(integers(1, config.vocab - 1), "id shift")
    for T in swept_lengths(ids.shape[1]):
        j = min(drawn_j, T - 1)
        changed = ids.copy()
        changed[:, j:] = (ids[:, j:] + shift) % config.vocab  # every id from j on changes
        call = f"gpt_logits(ids[{ids.shape[0]}, {T}], params, n_heads={config.n_heads}) with ids[:, {j}:] changed"
        before = _logits(impl, config, ids[:, :T], params, call)
        after = _logits(impl, config, changed[:, :T], params, call)
        # Exact: a masked attention weight is exactly 0, so no bit of a future token reaches the past (perturbing, not truncating).
        assert_equal(after[:, :j], before[:, :j], f"logits at positions < {j}", call)


@invariant(
    requires=("gpt_logits",),
    hint="the logits of a position depend on the sequence's length: the blocks run without the causal mask (a prefix "
         "then misses the later tokens its positions saw), the position table is indexed from the end, "
         "or the mask is built for another length, or is right only up to some length (a buffer for a fixed block "
         "size, a kernel masking only within its tiles)",
)
def prefix_consistency(impl, case):
    """The logits of the first j tokens alone equal the first j positions of the full sequence's logits, to rounding.

    Not bitwise: a shorter sequence has other shapes, and other shapes take other kernels and
    summation orders (transformers' GPT-2 and torch's attention differ by ~1e-7 when truncated),
    and each LayerNorm magnifies those differences by its condition (prefix_conditions; at d_model = 2
    a correct float32 GPT-2 missed the plain tolerance by 1.1× once in 57,000 examples).
    Drawn at lengths up to 129: a long draw runs at every length either side of 16, 32, 64 and 128 up to it, and each
    run is compared with the next longer one (so every length is both the prefix and the whole sequence once), and
    the drawn j with the shortest run that holds it. A sum over T keys rounds up to T/8 times as much as the short
    sequences the table's factor was measured on (Tolerance.summed_over): a correct float32 model of 129 positions
    with uniform attention (W_q = W_k = 0) missed the unscaled tolerance by 1.6× once in 1.46 million examples, its
    sums over 92 and 129 keys paired differently.
    """
    config, params, ids = _model_case(impl, case, min_seq=2, long_lengths=SWEPT_LENGTHS)
    drawn_j = case.draw(integers(1, ids.shape[1] - 1), "j (prefix length, < T)")
    lengths = swept_lengths(ids.shape[1])  # (T,), or 15, 17, 31, ... up to T
    conditions = prefix_conditions(impl, ids, params, config.n_heads)  # (T,): the model's condition on each prefix
    holding = min(T for T in lengths if T >= drawn_j)
    pairs = ([(drawn_j, holding)] if drawn_j < holding else []) + list(zip(lengths, lengths[1:], strict=False))  # (prefix, whole)
    runs = {}
    for j, T in pairs:
        call = f"gpt_logits(ids[:, :{j}], params, n_heads={config.n_heads}) vs gpt_logits(ids[:, :{T}], ...)[:, :{j}]"
        prefix, full = (_run_once(runs, impl, config, ids[:, :n], params, call) for n in (j, T))
        tol = impl.tolerance.scaled(2).conditioned(conditions[T - 1]).summed_over(T)  # both sides rounded
        assert_close(prefix, full[:, :j], "logits of the prefix", tol, call)


def _run_once(runs, impl, config, ids, params, call):
    """_logits of ids, remembered in `runs` by length: a sweep compares each length's run with two others."""
    T = ids.shape[1]
    if T not in runs:
        runs[T] = _logits(impl, config, ids, params, call)
    return runs[T]


@invariant(
    requires=("gpt_logits", "layer_norm"),
    hint="the output layer is not the token table transposed (an untied head, a separately initialised projection, "
         "wpe instead of wte) or the final LayerNorm is skipped: logits = LN_f(h)·wteᵀ",
)
def tied_output(impl, case):
    """With every block silenced (the identity), the logits are layer_norm(wte[ids] + wpe[:T]; lnf_g, lnf_b)·wteᵀ."""
    config, params, ids = _model_case(impl, case)
    quiet = {**params, "blocks": [silenced(b, "attention", "feed_forward") for b in params["blocks"]]}
    call = f"gpt_logits(ids, params with every block silenced (W_o, b_o, W2, b2 = 0), n_heads={config.n_heads})"
    got = _logits(impl, config, ids, quiet, call)
    wte, wpe = impl.as_seen(params["wte"]), impl.as_seen(params["wpe"])
    h = impl.layer_norm(wte[ids] + wpe[: ids.shape[1]], params["lnf_g"], params["lnf_b"], layer_norm_eps(impl)).astype(np.float64)  # (B, T, d)
    assert_close(got, h @ wte.T, "logits", _head_tolerance(impl, h, wte), call)  # (B, T, d) x (d, V) -> (B, T, V)


@invariant(
    requires=("gpt_logits",),
    hint="the final LayerNorm (lnf_g, lnf_b) is skipped, or its gain or bias is not used, or the head is not wteᵀ (an untied "
         "head): the head must read LN_f(h), so lnf_g = 0 leaves only lnf_b·wteᵀ",
)
def final_norm(impl, case):
    """With lnf_g = 0 the final norm outputs lnf_b at every position, so every position's logits are lnf_b·wteᵀ."""
    config, params, ids = _model_case(impl, case)
    call = f"gpt_logits(ids, params with lnf_g = 0, n_heads={config.n_heads})"
    got = _logits(impl, config, ids, {**params, "lnf_g": np.zeros_like(params["lnf_g"])}, call)
    b, wte = impl.as_seen(params["lnf_b"]), impl.as_seen(params["wte"])
    expected = b @ wte.T  # (d,) x (d, V) -> (V,), at every position
    assert_close(got, np.broadcast_to(expected, got.shape), "logits", _head_tolerance(impl, b, wte), call)


@invariant(
    requires=("gpt_logits",),
    hint="positions are not 0 .. T-1: the position table is indexed from the end (wpe[-T:]) or by token id (wpe[ids])",
)
def positions_from_start(impl, case):
    """A sequence of T tokens uses position rows 0 .. T-1 only: changing the rows of wpe from T on leaves its logits exactly equal."""
    config, params, ids = _model_case(impl, case, spare_positions=1)
    T = ids.shape[1]
    rows = case.draw(float_arrays((config.max_len - T, config.d_model)), "new wpe[T:]")  # (max_len - T, d)
    changed = params["wpe"].copy()
    changed[T:] = rows
    call = f"gpt_logits(ids (T={T}), params with wpe[{T}:] changed (max_len={config.max_len}), n_heads={config.n_heads})"
    before = _logits(impl, config, ids, params, call)
    after = _logits(impl, config, ids, {**params, "wpe": changed}, call)
    assert_equal(after, before, "logits", call)  # exact: the rows read are bitwise the same


BAD_INPUTS = ("an id >= vocab", "a negative id", "more tokens than max_len")


@invariant(
    requires=("gpt_logits",),
    hint="gpt_logits does not check its input: ids outside [0, vocab) (numpy and torch wrap negative indices silently) "
         "and sequences longer than max_len must raise ValueError, not return or fail in an indexing error",
)
def refuses_bad_ids(impl, case):
    """gpt_logits raises ValueError for an id >= vocab, a negative id, or a sequence longer than max_len."""
    problem = case.draw(sampled_from(BAD_INPUTS), "problem")
    config = case.draw(configs_for(impl, max_layers=1), "config")
    params = case.draw(biases_as_declared(impl, gpt_params(config)), "params")
    if problem == "more tokens than max_len":
        ids = case.draw(token_ids(config.vocab, max_batch=2, min_seq=config.max_len + 1, max_seq=config.max_len + 3), "ids")
    else:
        ids = case.draw(token_ids(config.vocab, max_batch=2, max_seq=config.max_len), "ids")
        where = case.draw(st.tuples(integers(0, ids.shape[0] - 1), integers(0, ids.shape[1] - 1)), "bad id's (row, position)")
        beyond = case.draw(integers(0, 3), "distance outside the vocabulary")
        ids[where] = config.vocab + beyond if problem == "an id >= vocab" else -1 - beyond
    call = f"gpt_logits(ids {ids.shape} with {problem} (vocab={config.vocab}, max_len={config.max_len}), params, n_heads={config.n_heads})"
    try:
        out = impl.gpt_logits(ids, params, config.n_heads)
        outcome = f"returned {type(out).__name__} of shape {getattr(out, 'shape', '?')}"
    except ImplementationError as exc:
        if isinstance(exc.original, ValueError):
            return
        outcome = f"raised {type(exc.original).__name__}"
    assert_value(outcome, "raised ValueError", "gpt_logits's answer", call)


@invariant(
    requires=("gpt_logits",),
    hint="the model differs from GPT-2's: ids + positions 0 .. T-1, pre-norm causal blocks, the final LayerNorm, "
         "the tied head wteᵀ; or a block convention differs (see block.agrees_with_reference: the biases, eps, GELU form)",
)
def agrees_with_reference(impl, case):
    """gpt_logits agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise).

    The reference uses the declared GELU_FORM, or either form for the whole model where none is
    declared (blocks in different forms match neither), and the declared LAYER_NORM_EPS.

    Below float64 the model is drawn with d_model >= 8, where its LayerNorms are well-conditioned
    (at d_model = 2 a row like [-2.0777, -2.0803] makes a correct float32 model, the reference's
    own included, miss by 2.5× the table), and vocab >= 8: the 16-bit tolerance is relative to
    the largest logit, and a handful of logits can all be small by cancellation.
    """
    config, params, ids = _model_case(impl, case, wide=impl.dtype != "float64")
    call = f"gpt_logits(ids, params, n_heads={config.n_heads})"
    got = _logits(impl, config, ids, params, call)
    # Up to two blocks, the final norm and the head: 8 × the table. Measured on reference.torch over 5,400 such
    # models, the worst was 4.6× in float16 and 1.8× in bfloat16.
    assert_agrees_with_reference(impl, "gpt_logits", (ids, params, config.n_heads), got, "logits", factor=8, call=call,
                                 options={"eps": layer_norm_eps(impl)}, gelu=True)
