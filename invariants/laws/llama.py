"""Invariants of the Llama-style block and model: the residual identity, causality, values not rotated, the reference.

llama_block(x (B, T, d), params, n_heads, n_kv_heads, rope_base, window) is pre-norm with RMSNorm:
h = x + Attn(RMSNorm(x)), out = h + SwiGLU(RMSNorm(h)); attention is grouped-query, causal, with
RoPE at positions 0 .. T - 1 on q and k (never v) and an optional sliding window. llama_logits(ids,
params, ...) embeds, runs the blocks, normalises and applies an untied head W_out (d, V). The
decoding path (llama_decode, the KV cache) has its invariants in invariants/laws/decoding.py.

What is drawn follows the declarations: q/k/v biases (Qwen2) only under QKV_BIASES = True, no
window under SLIDING_WINDOW = False, the RMSNorm eps RMS_NORM_EPS (else 1e-5), the pairing
ROPE_PAIRING (undeclared: either pairing's reference, one for the whole call), the base ROPE_THETA,
whole sequences of at most w tokens under CHUNKS_WITHIN_WINDOW; under COMPUTE_DTYPE = "float32" a
float64 run holds the invariants held to rounding to float32's.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants.asserts import InvariantViolation, assert_close, assert_equal, assert_shape
from invariants.conventions import declared, input_as_rounded, rms_norm_eps
from invariants.inputs import valid_inputs
from invariants.laws.norms import errors_far_from_and_near_eps
from invariants.laws.reference_check import at_quiet_rows, reference_tolerance
from invariants.laws.rope import assert_close_to_a_pairing, rope_pairings
from invariants.protocol import ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import float_arrays, integers
from invariants.strategies.decoder import llama_block_params, llama_configs, llama_params
from invariants.strategies.norms import loud_rows
from invariants.strategies.params import token_ids

LESSON = 130  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("llama_block", "llama_logits")  # the protocol functions whose laws it holds

_BLOCK_OUTPUTS = ("W_o", "W_down")  # what the two sublayers' outputs are made of (no output biases in Llama)


def draw_config(impl, case, **options):
    """A LlamaConfig impl can take: q/k/v biases only if it declares QKV_BIASES = True, no window under SLIDING_WINDOW = False,
    its ROPE_THETA as the base where it declares one."""
    options.setdefault("qkv_bias", None if declared(impl, "QKV_BIASES") else False)
    if not declared(impl, "SLIDING_WINDOW"):
        options["windowed"] = False
    if declared(impl, "ROPE_THETA") is not None:
        options["bases"] = (declared(impl, "ROPE_THETA"),)
    return case.draw(llama_configs(**options), "config")


def draw_one_layer_config(impl, case):
    """A one-layer LlamaConfig impl can take (draw_config), whose window, where CHUNKS_WITHIN_WINDOW is declared,
    takes the 3 tokens the drawers of llama_block, llama_logits and llama_decode draw in one forward."""
    return draw_config(impl, case, max_layers=1, **({"min_window": 3} if declared(impl, "CHUNKS_WITHIN_WINDOW") else {}))


@valid_inputs("llama_block")
def llama_block_arguments(impl, case):
    """A (1, 3, d) batch and one Llama block's weights, heads, RoPE base and window as declared."""
    config = draw_one_layer_config(impl, case)
    x = case.draw(float_arrays((1, 3, config.d_model)), "x")
    params = case.draw(llama_block_params(config), "params")
    return x, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window


@valid_inputs("llama_logits")
def llama_logits_arguments(impl, case):
    """Token ids of up to 3 positions and one-layer Llama weights, heads, RoPE base and window as declared."""
    config = draw_one_layer_config(impl, case)
    params = case.draw(llama_params(config), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=1, max_seq=3), "ids")
    return ids, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window


def max_whole_sequence(impl, config, longest=6):
    """The longest sequence impl takes in one forward: at most w under CHUNKS_WITHIN_WINDOW with a window, else `longest`."""
    if config.window is not None and declared(impl, "CHUNKS_WITHIN_WINDOW"):
        return min(longest, config.window)
    return longest


def silenced(params):
    """A copy of llama block params whose sublayers output exactly 0: W_o and W_down zeroed."""
    return {name: np.zeros_like(value) if name in _BLOCK_OUTPUTS else value for name, value in params.items()}


SIZES = ("n_heads", "n_kv_heads", "rope_base", "window")  # the protocol's size arguments after params, as LlamaConfig names them


def sizes(config):
    """The protocol's size arguments after params: (n_heads, n_kv_heads, rope_base, window)."""
    return tuple(named_sizes(config).values())


def named_sizes(config, **more):
    """{size argument: its value} for describe_call, with `more` arguments (ids, chunks) beside them."""
    return {**{name: getattr(config, name) for name in SIZES}, **more}


def reference_with_pairings(impl, name, args):
    """{pairing: the float64 reference's answer to name(*args)} for each pairing impl may follow, at its RMSNorm eps."""
    seen = impl.as_seen(args)
    return {p: getattr(ref, name)(*seen, pairing=p, eps=rms_norm_eps(impl)) for p in rope_pairings(impl)}


def _row_condition(h, terms, eps):
    """How much an RMSNorm of h (..., d) magnifies the rounding of the sums that made it: max over rows of max(terms) / rms(h)."""
    return float((terms.max(axis=-1) / np.sqrt((h * h).mean(axis=-1) + eps)).max(initial=1.0))


def norms_condition(impl, x, blocks, config, *, final=False):
    """The worst condition of the RMSNorm inputs of `blocks` run on x (B, T, d) in float64 (and of the final norm's, final=True).

    The residual stream is a sum of terms (x, each attention and SwiGLU output) whose roundings are relative to the
    terms, not to the sum; where they cancel, a norm divides those errors by a small root mean square and magnifies
    them (the RMSNorm form of layer_norm_condition). Checks that compare two roundings of a block or a model grow their
    tolerance with it beyond the typical 8 (Tolerance.conditioned).
    """
    eps, pairing = rms_norm_eps(impl), rope_pairings(impl)[0]
    x, blocks = impl.as_seen((x, blocks))
    positions = np.arange(x.shape[1])
    terms, worst = np.abs(x), 1.0
    for p in blocks:
        worst = max(worst, _row_condition(x, terms, eps))
        attended, _ = ref.llama_attention(ref.rms_norm(x, p["attn_norm"], eps), p, config.n_heads, config.n_kv_heads, positions,
                                          config.rope_base, config.window, pairing=pairing)
        h, terms = x + attended, terms + np.abs(attended)
        worst = max(worst, _row_condition(h, terms, eps))
        fed = ref.swiglu(ref.rms_norm(h, p["ffn_norm"], eps), p["W_gate"], p["W_up"], p["W_down"])
        x, terms = h + fed, terms + np.abs(fed)
    return max(worst, _row_condition(x, terms, eps)) if final else worst


def model_condition(impl, ids, params, config):
    """norms_condition of the whole model on ids, the final norm included."""
    return norms_condition(impl, params["embed"][ids], params["blocks"], config, final=True)


def _block_case(impl, case, *, min_seq=1, **options):
    if declared(impl, "CHUNKS_WITHIN_WINDOW"):
        options["min_window"] = min_seq  # a window that takes min_seq tokens in one forward
    config = draw_config(impl, case, **options)
    shape = case.draw(st.tuples(integers(1, 2), integers(min_seq, max_whole_sequence(impl, config))), "(batch, seq)")
    x = case.draw(loud_rows(float_arrays((*shape, config.d_model)), impl.dtype), "x")  # (B, T, d): rows past 256 in float16
    return config, x, case.draw(llama_block_params(config), "params")


def _block(impl, x, params, config, call):
    __tracebackhide__ = True
    return assert_shape(impl.llama_block(x, params, *sizes(config)), x.shape, "llama_block output", call)


def _logits(impl, ids, params, config, call):
    __tracebackhide__ = True
    return assert_shape(impl.llama_logits(ids, params, *sizes(config)), (*ids.shape, config.vocab), "llama_logits output", call)


@invariant(
    requires=("llama_block",),
    hint="the residual is replaced instead of added (x = attn(norm(x))), a sublayer has no skip connection, or a norm is applied "
    "after the add (post-norm): a pre-norm block whose W_o and W_down are 0 is the identity",
)
def residual_identity(impl, case):
    """With W_o and W_down zeroed, a Llama block returns its input exactly (x rounded to float32 under COMPUTE_DTYPE), and so
    does a stack of up to 3 such blocks."""
    config, x, _ = _block_case(impl, case)
    stack = case.draw(st.lists(llama_block_params(config), min_size=1, max_size=3), "params of each block")
    y = x
    for i, params in enumerate(stack):
        call = describe_call("llama_block", named_sizes(config), f"with W_o = W_down = 0, block {i + 1} of {len(stack)}")
        y = _block(impl, y, silenced(params), config, call)
        assert_equal(y, input_as_rounded(impl, y, x), f"output of block {i + 1} of {len(stack)}", call)  # x + 0.0 == x, -0.0 included


@invariant(
    requires=("llama_block",),
    hint="the block's attention is not causal (is_causal not passed, a mask built for another length) or something mixes "
    "tokens outside attention (a norm over the sequence axis, RoPE angles from the sequence length)",
)
def causal_non_leakage(impl, case):
    """Changing x at positions >= j leaves the Llama block's outputs at positions < j exactly equal."""
    config, x, params = _block_case(impl, case, min_seq=2)
    B, T, d = x.shape
    j = case.draw(integers(1, T - 1), "j (first changed position)")
    changed = x.copy()
    changed[:, j:] = case.draw(float_arrays((B, T - j, d), min_scale=0.25, max_scale=4.0), "new x[:, j:]")
    call = describe_call("llama_block", named_sizes(config), f"with x[:, {j}:] changed")
    before, after = _block(impl, x, params, config, call), _block(impl, changed, params, config, call)
    assert_equal(after[:, :j], before[:, :j], f"llama_block output at positions < {j}", call)


def _running_mean_of_values(impl, x, params, config):
    """float64 x + (each query's mean of the values it may see)·W_o: the Llama block with W_q = 0 (uniform weights) and W_down = 0."""
    x, p = impl.as_seen((x, params))
    B, T, d = x.shape
    normed = ref.rms_norm(x, p["attn_norm"], rms_norm_eps(impl))  # (B, T, d)
    v = ref.split_heads(ref.project(normed, p["W_v"], p.get("b_v")), config.n_kv_heads)  # (B, H_kv, T, D)
    v = ref.repeat_kv(v, config.group)  # (B, H, T, D)
    seen = ref.visible_keys(T, T, True, config.window).astype(np.float64)  # (T, T)
    means = (seen / seen.sum(axis=-1, keepdims=True)) @ v  # (T, T) x (B, H, T, D) -> (B, H, T, D): uniform weights
    merged = ref.merge_heads(means)  # (B, T, H·D)
    return x + merged @ p["W_o"], float((np.abs(x) + np.abs(merged) @ np.abs(p["W_o"])).max())


@invariant(
    requires=("llama_block",),
    hint="RoPE is applied to the values (it belongs on q and k only: rotated values make the output depend on absolute "
    "positions), the values are taken before the norm, or the weights of a zero query are not uniform over the visible keys "
    "(a mask that is missing or not causal)",
)
def values_are_not_rotated(impl, case):
    """With W_q = 0 (every score 0: uniform weights) and W_down = 0, the block is x + (each position's mean of the values it may see)·W_o,
    with the values RMSNorm(x)·W_v unrotated (to rounding)."""
    config, x, params = _block_case(impl, case)
    quiet = {**params, "W_q": np.zeros_like(params["W_q"]), "W_down": np.zeros_like(params["W_down"])}
    if "b_q" in quiet:
        quiet["b_q"] = np.zeros_like(quiet["b_q"])
    call = describe_call("llama_block", named_sizes(config), "with W_q = 0 (and b_q = 0) and W_down = 0")
    got = _block(impl, x, quiet, config, call)
    expected, scale = _running_mean_of_values(impl, x, quiet, config)
    tol = impl.tolerance.scaled(ROUNDINGS["llama_block"]).at_scale(scale)
    assert_close(got, expected, "llama_block output: x + the running mean of unrotated values, @ W_o", tol, call)


def _takes_no_biases(impl):
    """An `applies=` function: a reason where impl takes no q/k/v biases (QKV_BIASES is not True), else None."""
    return None if declared(impl, "QKV_BIASES") else f"{impl.label} takes no q/k/v biases (QKV_BIASES = True is not declared)"


def _without_biases(params):
    """A copy of llama block params without q/k/v biases."""
    return {name: value for name, value in params.items() if name not in ("b_q", "b_k", "b_v")}


@invariant(
    requires=("llama_block",),
    hint="the block's RMSNorm is not x / √(mean(x²) + eps) · gain: eps added outside the root, the row centred first (a LayerNorm's "
    "centring), the gain applied as (1 + gain) or taken from the other norm, or the mean taken over another axis; else position 0 "
    "sees more than its own key (a mask that is not causal) or the value heads are repeated in another order",
)
def block_norm_seen_alone(impl, case):
    """With W_q = 0, W_down = 0 and no biases, the block's first position is x + RMSNorm(x; attn_norm)·W_v·W_o: it sees only its own
    key, and RoPE is the identity at position 0, so its output shows the block's own norm alone (to rounding)."""
    config, x, params = _block_case(impl, case)
    quiet = {**_without_biases(params), "W_q": np.zeros_like(params["W_q"]), "W_down": np.zeros_like(params["W_down"])}
    call = describe_call("llama_block", named_sizes(config), "with W_q = 0, W_down = 0 and no q/k/v biases, at position 0")
    got = _block(impl, x, quiet, config, call)[:, :1]
    expected, scale = _running_mean_of_values(impl, x[:, :1], quiet, config)
    tol = impl.tolerance.scaled(ROUNDINGS["llama_block"]).at_scale(scale)
    try:
        assert_close(got, expected, "llama_block output at position 0: x + RMSNorm(x; attn_norm)·W_v·W_o", tol, call)
    except InvariantViolation as exc:  # the counterexample's figure: does the error grow as a row's mean square nears eps?

        def rerun(rows):  # (B, 1, d): position 0 alone
            return _block(impl, rows, quiet, config, call), _running_mean_of_values(impl, rows, quiet, config)[0]

        raise InvariantViolation(**exc.measured, **errors_far_from_and_near_eps(rerun, x[:, :1], rms_norm_eps(impl))) from None


@invariant(
    requires=("llama_block",),
    hint="the value bias b_v does not reach the values as it is: the q/k/v biases are dropped (never read), another bias is added "
    "in b_v's place (b_k where b_v belongs), or RoPE is applied to the values (b_v rotated by position)",
    applies=_takes_no_biases,
)
def value_bias_reaches_values(impl, case):
    """With W_q = W_k = W_v = 0 and W_down = 0, every value is b_v, so the block is x + b_v (repeated to each query head)·W_o
    at every position, whatever the norms, RoPE and mask (to rounding); drawn with biases only."""
    config, x, params = _block_case(impl, case, qkv_bias=True)
    zeroed = {name: np.zeros_like(params[name]) for name in ("W_q", "W_k", "W_v", "W_down")}
    call = describe_call("llama_block", named_sizes(config), "with W_q = W_k = W_v = 0 and W_down = 0")
    got = _block(impl, x, {**params, **zeroed}, config, call)
    x64, p = impl.as_seen((x, params))
    values = ref.repeat_kv(np.broadcast_to(p["b_v"].reshape(config.n_kv_heads, 1, -1), (x.shape[0], config.n_kv_heads, x.shape[1],
                                                                                          p["b_v"].size // config.n_kv_heads)), config.group)
    added = ref.merge_heads(values) @ p["W_o"]  # (B, T, d): each head's weighted mean of identical values is b_v
    tol = impl.tolerance.scaled(ROUNDINGS["llama_block"]).at_scale(float((np.abs(x64) + np.abs(ref.merge_heads(values)) @ np.abs(p["W_o"])).max()))
    assert_close(got, x64 + added, "llama_block output: x + b_v (repeated per query head)·W_o", tol, call)


@invariant(
    requires=("llama_block",),
    hint="the block differs from Llama's: RMSNorm (not LayerNorm, eps inside the root) before each sublayer, attention then "
    "SwiGLU in sequence, grouped-query heads in repeat-interleave order, RoPE θ_i = rope_base^(-2i/D) in the declared pairing, "
    "the q/k/v biases used when given (QKV_BIASES = True), the window as min(p + 1, w) keys; or RMSNorm's x² in float16 (inf past 256)",
)
def block_agrees_with_reference(impl, case):
    """llama_block agrees with the float64 reference in its RoPE pairing (1e-10 in float64, the dtype tolerance otherwise), on
    rows past 256 too in float16 (loud_rows), which only a norm that upcasts holds."""
    config, x, params = _block_case(impl, case)
    call = describe_call("llama_block", named_sizes(config))
    got = _block(impl, x, params, config, call)
    answers = reference_with_pairings(impl, "llama_block", (x, params, *sizes(config)))
    tol = reference_tolerance(impl, factor=ROUNDINGS["llama_block"], condition=lambda: norms_condition(impl, x, [params], config))
    scale = max(float(np.abs(a).max()) for a in answers.values())
    assert_close_to_a_pairing(impl, got, answers, "llama_block output", tol.at_scale(scale), call)
    quiet = at_quiet_rows(x, got, answers)
    if quiet is not None:
        got, answers = quiet
        scale = max(float(np.abs(a).max()) for a in answers.values())
        assert_close_to_a_pairing(impl, got, answers, "llama_block output at the rows below 256", tol.at_scale(scale), call)


def model_case(impl, case, *, min_seq=1, decoding=False, edge=False, **options):
    """Draw a config, a params tree and ids (B, T) for llama_logits and llama_decode.

    decoding: the ids may be longer than one forward takes (CHUNKS_WITHIN_WINDOW bounds llama_decode's
    chunks, not the sequence); edge: more tokens than the window (w + 1 to 6).
    """
    if declared(impl, "CHUNKS_WITHIN_WINDOW") and not decoding:
        options["min_window"] = max(min_seq, options.get("min_window", 1))
    config = draw_config(impl, case, **options)
    params = case.draw(loud_rows(llama_params(config), impl.dtype, part="embed"), "params")  # embeddings past 256 in float16
    low, high = (config.window + 1, 6) if edge else (min_seq, 6 if decoding else max_whole_sequence(impl, config))
    ids = case.draw(token_ids(config.vocab, max_batch=2, min_seq=low, max_seq=high), "ids")
    return config, params, ids


@invariant(
    requires=("llama_logits",),
    hint="a block is not causal, or the model mixes positions outside attention: RoPE angles computed from the sequence "
    "length, or a norm over the sequence axis",
)
def model_causal_non_leakage(impl, case):
    """Logits at positions < j do not depend on the ids at positions >= j: changing those leaves them exactly equal."""
    config, params, ids = model_case(impl, case, min_seq=2)
    B, T = ids.shape
    j = case.draw(integers(1, T - 1), "j (first changed position)")
    changed = ids.copy()
    changed[:, j:] = case.draw(token_ids(config.vocab, min_batch=B, max_batch=B, min_seq=T - j, max_seq=T - j), "new ids[:, j:]")
    call = describe_call("llama_logits", named_sizes(config, ids=ids), f"with ids[:, {j}:] changed")
    before, after = _logits(impl, ids, params, config, call), _logits(impl, changed, params, config, call)
    assert_equal(after[:, :j], before[:, :j], f"logits at positions < {j}", call)


@invariant(
    requires=("llama_logits",),
    hint="the model differs from the protocol's Llama: embeddings not scaled, the blocks in order, a final RMSNorm (norm) and "
    "an untied head W_out (d, V) — not the embedding table transposed; or RMSNorm's x² in float16 (inf past 256)",
)
def logits_agree_with_reference(impl, case):
    """llama_logits agrees with the float64 reference in its RoPE pairing (1e-10 in float64, the dtype tolerance otherwise)."""
    config, params, ids = model_case(impl, case)
    call = describe_call("llama_logits", named_sizes(config, ids=ids))
    logits_against_reference(impl, _logits(impl, ids, params, config, call), ids, params, config, "logits", call)


def logits_against_reference(impl, got, ids, params, config, what, call):
    """got (B, T, V) is within the agreement tolerance of the float64 reference's llama_logits in a pairing impl may follow."""
    __tracebackhide__ = True
    answers = reference_with_pairings(impl, "llama_logits", (ids, params, *sizes(config)))
    tol = reference_tolerance(impl, factor=ROUNDINGS["llama_block"] * max(1, config.n_layers),
                              condition=lambda: model_condition(impl, ids, params, config))
    scale = max(float(np.abs(a).max()) for a in answers.values())
    try:
        assert_close_to_a_pairing(impl, got, answers, what, tol.at_scale(scale), call)
    except InvariantViolation as exc:  # the counterexample's figure: does the answer skip the final norm?
        raise InvariantViolation(**exc.measured, agrees_pre_norm=_agrees_pre_norm(impl, got, ids, params, config, tol.at_scale(scale))) from None


def _agrees_pre_norm(impl, got, ids, params, config, tol):
    """Whether got is, in a pairing impl may follow, the reference's last hidden state before its final RMSNorm, times W_out."""
    seen_ids, seen = impl.as_seen((ids, params))
    n_heads, n_kv_heads, rope_base, window = sizes(config)
    positions = ref.chunk_positions(0, np.shape(seen_ids)[1])
    for pairing in rope_pairings(impl):
        x = seen["embed"][seen_ids]  # (B, T, d)
        for block in seen["blocks"]:
            x, _ = ref.llama_block_step(x, block, n_heads, n_kv_heads, rope_base, window, positions, pairing=pairing, eps=rms_norm_eps(impl))
        if np.shape(got) == np.shape(x @ seen["W_out"]) and tol.allows(np.asarray(got, dtype=np.float64), x @ seen["W_out"]).all():
            return True
    return False
