"""Invariants of per-layer attention types: local (sliding-window) and global (full) layers in one model, each type with its RoPE base.

hybrid_logits(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases) is llama_logits whose block i attends as
layer_types[i] says (transformers' "sliding_attention" / "full_attention"), with rope_bases[that type]; hybrid_decode runs
it in chunks on the implementation's own cache. The laws: one type everywhere is llama_logits; with every layer sliding, a
token further back than the receptive field L·(w − 1) changes nothing (exactly); a base of a type no layer has changes
nothing (exactly); the reference agrees (Gemma 2's and gpt-oss's alternation, Gemma 3's five to one, Qwen2's
max_window_layers, any mix); decoding equals the full forward across the window's edge; full layers keep every key while
sliding ones may keep only the last w - 1.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape, assert_where
from invariants.conventions import declared, declared_skip, rms_norm_eps
from invariants.inputs import valid_inputs
from invariants.laws.decoding import schedules_for
from invariants.laws.llama import model_condition
from invariants.laws.reference_check import reference_tolerance
from invariants.laws.rope import assert_close_to_a_pairing, rope_pairings
from invariants.protocol import ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import integers
from invariants.strategies.decoder import ROPE_BASES, llama_params
from invariants.strategies.layer_types import FULL, SLIDING, hybrid_configs
from invariants.strategies.norms import loud_rows
from invariants.strategies.params import token_ids

LESSON = 142  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("hybrid_logits", "hybrid_decode")  # the protocol functions whose laws it holds
MAX_SEQ = 7  # sequences cross windows of up to 3 and two layers' receptive field


def _configs(impl, **options):
    """hybrid_configs(**options) for impl: q/k/v biases only under QKV_BIASES = True, one base for both types under
    ROPE_BASE_PER_LAYER_TYPE = False."""
    options.setdefault("qkv_bias", None if declared(impl, "QKV_BIASES") else False)
    return hybrid_configs(one_base=not declared(impl, "ROPE_BASE_PER_LAYER_TYPE"), **options)


def draw_hybrid(impl, case, *, min_seq=1, decoding=False, **options):
    """A HybridConfig, params and ids (B, T) impl takes (_configs), whole sequences of at most w tokens under
    CHUNKS_WITHIN_WINDOW (not for decoding, whose chunks schedules_for bounds)."""
    if declared(impl, "CHUNKS_WITHIN_WINDOW") and not decoding:
        options["min_window"] = max(min_seq, options.get("min_window", 1))
    hybrid = case.draw(_configs(impl, **options), "hybrid config")
    config = hybrid.config
    longest = config.window if declared(impl, "CHUNKS_WITHIN_WINDOW") and not decoding else MAX_SEQ
    params = case.draw(loud_rows(llama_params(config), impl.dtype, part="embed"), "params")  # embeddings past 256 in float16
    ids = case.draw(token_ids(config.vocab, max_batch=2, min_seq=min(min_seq, longest), max_seq=longest), "ids")
    return hybrid, params, ids


def _shown(hybrid, **more):
    return {"n_heads": hybrid.config.n_heads, "n_kv_heads": hybrid.config.n_kv_heads, "layer_types": list(hybrid.layer_types),
            "window": hybrid.config.window, "rope_bases": hybrid.rope_bases, **more}


@valid_inputs("hybrid_logits")
def hybrid_logits_arguments(impl, case):
    """Token ids and a model of up to 3 layers of drawn types, the window and a RoPE base per type."""
    hybrid, params, ids = draw_hybrid(impl, case)
    return (ids, params, *hybrid.sizes)


@valid_inputs("hybrid_decode")
def hybrid_decode_arguments(impl, case):
    """hybrid_logits' arguments and a split of the ids into chunks impl declares it takes."""
    hybrid, params, ids = draw_hybrid(impl, case, decoding=True)
    return (ids, params, *hybrid.sizes, case.draw(schedules_for(impl, ids.shape[1], hybrid.config.window), "chunks"))


def _logits(impl, ids, params, hybrid, call, *, rope_bases=None):
    __tracebackhide__ = True
    n_heads, n_kv_heads, layer_types, window, bases = hybrid.sizes
    out = impl.hybrid_logits(ids, params, n_heads, n_kv_heads, layer_types, window, bases if rope_bases is None else rope_bases)
    return assert_shape(out, (*ids.shape, hybrid.config.vocab), "hybrid_logits output", call)


def _model_tolerance(impl, ids, params, hybrid, scale):
    """Two roundings of a model compared: the dtype's tolerance × the block's budget per layer, grown by the norms' condition."""
    config = hybrid.config
    tol = impl.tolerance.scaled(ROUNDINGS["llama_block"] * max(1, config.n_layers)).conditioned(model_condition(impl, ids, params, config))
    return tol.at_scale(scale)


@invariant(
    requires=("hybrid_logits", "llama_logits"),
    hint="layer_types is not read as written: the window applied to every layer (full layers included: Qwen2's max_window_layers "
    "ignored) or to none, or a layer takes the other type's RoPE base",
)
def one_type_is_llama(impl, case):
    """With every layer full, hybrid_logits is llama_logits with no window at the full base; with every layer sliding, llama_logits
    with the window at the sliding base (to rounding)."""
    hybrid, params, ids = draw_hybrid(impl, case, patterns=("all full", "all sliding"))
    kind = hybrid.layer_types[0]
    window = hybrid.config.window if kind == SLIDING else None
    call = describe_call("hybrid_logits", _shown(hybrid, ids=ids), f"vs llama_logits(window={window}, rope_base={hybrid.rope_bases[kind]})")
    got = _logits(impl, ids, params, hybrid, call)
    expected = assert_shape(impl.llama_logits(ids, params, hybrid.config.n_heads, hybrid.config.n_kv_heads, hybrid.rope_bases[kind], window),
                            got.shape, "llama_logits output", call)
    assert_close(got, expected, f"hybrid_logits with every layer {kind}", _model_tolerance(impl, ids, params, hybrid,
                                                                                           float(np.abs(expected).max(initial=0.0))), call)


@invariant(
    requires=("hybrid_logits",),
    hint="a sliding layer attends beyond its window: the window ignored (every layer global), applied only in prefill or decode, "
    "or one key too wide (w + 1 keys)",
)
def far_tokens_unseen_by_sliding_layers(impl, case):
    """With every layer sliding (window w, L layers), changing the ids at positions < j leaves the logits at positions >= j + L·(w − 1)
    exactly equal: a position's receptive field is its last L·(w − 1) + 1 tokens."""
    hybrid = case.draw(_configs(impl, patterns=("all sliding",), max_layers=2), "hybrid config")
    config = hybrid.config
    reach = config.n_layers * (config.window - 1)
    if declared(impl, "CHUNKS_WITHIN_WINDOW") and reach + 2 > config.window:  # its forward refuses a sequence long enough to show it
        return
    params = case.draw(llama_params(config), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=2, min_seq=reach + 2, max_seq=max(reach + 2, MAX_SEQ)), "ids")
    B, T = ids.shape
    j = case.draw(integers(1, T - 1 - reach), "j (ids before it changed)")
    changed = ids.copy()
    changed[:, :j] = case.draw(token_ids(config.vocab, min_batch=B, max_batch=B, min_seq=j, max_seq=j), "new ids[:, :j]")
    call = describe_call("hybrid_logits", _shown(hybrid, ids=ids), f"with ids[:, :{j}] changed")
    before, after = _logits(impl, ids, params, hybrid, call), _logits(impl, changed, params, hybrid, call)
    assert_equal(after[:, j + reach:], before[:, j + reach:], f"logits at positions >= {j + reach} (j + L·(w - 1))", call)


@invariant(
    requires=("hybrid_logits",),
    hint="a layer reads the other type's RoPE base: Gemma 3's global layers on the local base (10,000 for 1,000,000), one base "
    "for every layer, or the bases keyed the other way round",
    applies=declared_skip("ROPE_BASE_PER_LAYER_TYPE", lambda per_type: not per_type, "its layers share one base: no type's base changes alone"),
)
def rope_base_read_by_type(impl, case):
    """Where every layer has one type, changing the other type's RoPE base leaves the logits exactly equal."""
    hybrid, params, ids = draw_hybrid(impl, case, patterns=("all full", "all sliding"))
    other = FULL if hybrid.layer_types[0] == SLIDING else SLIDING
    base = case.draw(st.sampled_from([b for b in ROPE_BASES if b != hybrid.rope_bases[other]]), f"new {other} base")
    changed = {**hybrid.rope_bases, other: base}
    call = describe_call("hybrid_logits", _shown(hybrid, ids=ids), f"with rope_bases[{other!r}] = {base}")
    before, after = _logits(impl, ids, params, hybrid, call), _logits(impl, ids, params, hybrid, call, rope_bases=changed)
    assert_equal(after, before, f"logits with every layer {hybrid.layer_types[0]}", call)


@invariant(
    requires=("hybrid_logits",),
    hint="the model differs from the protocol's: layer i is sliding exactly where layer_types[i] is \"sliding_attention\" (Gemma 2 "
    "and gpt-oss from layer 0, Gemma 3 global where (i + 1) % 6 == 0, Qwen2 full for i < max_window_layers), each type with its "
    "own RoPE base, the window as min(p + 1, w) keys",
)
def hybrid_logits_agree_with_reference(impl, case):
    """hybrid_logits agrees with the float64 reference in its RoPE pairing (1e-10 in float64, the dtype tolerance otherwise)."""
    hybrid, params, ids = draw_hybrid(impl, case)
    call = describe_call("hybrid_logits", _shown(hybrid, ids=ids))
    got = _logits(impl, ids, params, hybrid, call)
    seen = impl.as_seen((ids, params))
    answers = {p: ref.hybrid_logits(*seen, *hybrid.sizes, pairing=p, eps=rms_norm_eps(impl)) for p in rope_pairings(impl)}
    tol = reference_tolerance(impl, factor=ROUNDINGS["llama_block"] * max(1, hybrid.config.n_layers),
                              condition=lambda: model_condition(impl, ids, params, hybrid.config))
    scale = max(float(np.abs(a).max()) for a in answers.values())
    assert_close_to_a_pairing(impl, got, answers, "hybrid_logits", tol.at_scale(scale), call)


def _decode(impl, ids, params, hybrid, chunks, call):
    """impl.hybrid_decode's (logits (B, T, V), what its cache holds), shapes checked."""
    __tracebackhide__ = True
    answer = impl.hybrid_decode(ids, params, *hybrid.sizes, chunks)
    logits = assert_shape(answer[0], (*ids.shape, hybrid.config.vocab), "decoded logits", call)
    held = np.asarray(answer[1])
    if held.ndim != 1:
        return logits, assert_shape(held, (len(chunks), hybrid.config.n_layers, hybrid.config.n_kv_heads, held.shape[-1]),
                                    "cache positions (chunks, layers, kv heads, slots)", call)
    return logits, assert_shape(held, chunks.shape, "cache sizes (one per chunk)", call)


def _decode_case(impl, case, **options):
    """A hybrid model, ids longer than the window and a schedule whose chunks straddle its edge where impl takes such chunks."""
    hybrid, params, ids = draw_hybrid(impl, case, decoding=True, min_window=2, min_seq=4, **options)
    w, T = hybrid.config.window, ids.shape[1]
    straddling = T > w and (declared(impl, "MAX_DECODE_CHUNK") or 2) >= 2 and case.draw(st.booleans(), "straddling the window's edge")
    chunks = case.draw(schedules_for(impl, T, w, min_chunks=2, straddling=straddling), "chunks")
    return hybrid, params, ids, chunks


@invariant(
    requires=("hybrid_decode", "hybrid_logits"),
    hint="the decode path treats layers alike: a full layer's cache trimmed to the window (it keeps every key), the window applied "
    "to every layer in decode, or ignored there; or a layer's chunk rotated with the other type's base",
)
def hybrid_decode_matches_full_forward(impl, case):
    """Decoding a hybrid model in chunks, across the sliding layers' window edge, gives hybrid_logits' logits at every position, to rounding."""
    hybrid, params, ids, chunks = _decode_case(impl, case)
    call = describe_call("hybrid_decode", _shown(hybrid, ids=ids, chunks=chunks), "vs hybrid_logits on the whole sequence")
    logits, _ = _decode(impl, ids, params, hybrid, chunks, call)
    if declared(impl, "CHUNKS_WITHIN_WINDOW") and ids.shape[1] > hybrid.config.window:  # its own forward refuses T > w
        seen = impl.as_seen((ids, params))
        full = {p: ref.hybrid_logits(*seen, *hybrid.sizes, pairing=p, eps=rms_norm_eps(impl)) for p in rope_pairings(impl)}
        tol = _model_tolerance(impl, ids, params, hybrid, max(float(np.abs(a).max()) for a in full.values()))
        assert_close_to_a_pairing(impl, logits, full, "decoded logits", tol, call)
        return
    full = _logits(impl, ids, params, hybrid, call)
    assert_close(logits, full, "decoded logits", _model_tolerance(impl, ids, params, hybrid, float(np.abs(full).max(initial=0.0))), call)


@invariant(
    requires=("hybrid_decode",),
    hint="a full layer's cache keeps only the window's keys (a sliding cache for every layer), a sliding layer's keeps fewer than "
    "the w - 1 its next query needs, or a position is held twice",
)
def hybrid_cache_law(impl, case):
    """After t tokens, each full layer's cache holds positions 0 .. t - 1 once each, and each sliding layer's at least the last
    w - 1 of them, none twice; a size lies between those counts × 2·B·H_kv·D."""
    hybrid, params, ids, chunks = _decode_case(impl, case)
    config, w = hybrid.config, hybrid.config.window
    call = describe_call("hybrid_decode", _shown(hybrid, ids=ids, chunks=chunks))
    _, held = _decode(impl, ids, params, hybrid, chunks, call)
    t = np.cumsum(chunks)  # (n,) tokens seen after each chunk
    sliding = np.array([kind == SLIDING for kind in hybrid.layer_types])  # (L,)
    if held.ndim == 1:
        per_token = 2 * ids.shape[0] * config.n_kv_heads * config.d_head  # one layer's keys and values of one position
        full_layers = int((~sliding).sum())
        low = per_token * (full_layers * t + int(sliding.sum()) * np.minimum(t, w - 1))
        assert_where((held >= low) & (held <= per_token * config.n_layers * t), held, "cache sizes",
                     f"between {per_token}·({full_layers}·t + {int(sliding.sum())}·min(t, w - 1)) and {per_token}·L·t, t = {t.tolist()}", call)
        return
    positions = np.arange(ids.shape[1])  # (T,)
    times = (held[..., None] == positions).sum(axis=-2)  # (n, L, H_kv, T)
    oldest = np.where(sliding[None, :], np.maximum(t[:, None] - w + 1, 0), 0)  # (n, L): the oldest position a layer must hold
    must = (positions < t[:, None, None, None]) & (positions >= oldest[:, :, None, None])  # (n, L, 1, T)
    assert_where((held == -1) | ((held >= 0) & (held < t[:, None, None, None])), held, "cache positions",
                 f"-1 (an empty slot) or a position already seen (< t, t = {t.tolist()})", call)
    assert_where((times <= 1) & (times >= must), times, "how often each position is held, per chunk, layer and kv head",
                 f"once for 0 .. t - 1 in full layers and max(0, t - w + 1) .. t - 1 in sliding ones {list(hybrid.layer_types)}, "
                 f"at most once, t = {t.tolist()}", call)
