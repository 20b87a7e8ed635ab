"""Strategies for the modern decoder (protocol v2): RoPE, grouped-query attention, masks, SwiGLU, Llama configs, decode schedules, cross-attention.

Valid by construction: n_heads is drawn as n_kv_heads × group (so H is divisible by H_kv), RoPE
head widths are drawn as 2 × pairs (even), windows run from 1 to past the number of keys, key
masks include fully padded rows on purpose, the keys are the queries' positions plus a drawn
number of cached ones (S >= T), and decode schedules are compositions of T (positive chunks that
sum to T, split anywhere). As in strategies/core.py, every array of one draw comes from one drawn
seed, so an example shrinks to small shapes and seed 0, and the report reproduces it exactly.

Sizes are small on purpose: the ci profile runs 60 examples of every invariant on both references
in well under a second each, and the laws hold at any size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_float, check_int, check_int_range, check_order
from invariants.strategies.core import cached_strategy, integers, just, mapped, sampled_from, scales, seeds

__all__ = [
    "GQAShape", "LlamaConfig", "cross_args", "cross_inputs", "decode_schedules", "decoder_block_params", "gqa_args", "gqa_inputs", "gqa_shapes",
    "init_decoder_block_params", "init_llama_block_params", "init_llama_params", "llama_block_params", "llama_configs", "llama_params",
    "position_runs", "qk_norm_args", "qk_norm_inputs", "rope_inputs", "swiglu_inputs",
]

ROPE_BASES = (10_000.0, 500_000.0, 100.0)  # Llama 2, Llama 3, and a small base whose low frequencies still turn
KEY_MASK_PATTERNS = ("random", "left padding", "right padding", "one item fully padded")
BIAS_STD = 0.2  # as strategies/params.py: biases and norm shifts small next to unit-size activations


def _check_choice_or_none(name, value):
    if value is not None and not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be True, False, or None to draw it")


def _booleans(choice):
    return st.booleans() if choice is None else just(choice)


def _check_scales(min_scale, max_scale):
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)


def _scales(min_scale, max_scale):
    return just(float(min_scale)) if min_scale == max_scale else st.floats(min_scale, max_scale)


# -- RoPE -------------------------------------------------------------------------------------------


def rope_inputs(*, min_batch=1, max_batch=2, min_heads=1, max_heads=2, min_seq=1, max_seq=6, min_pairs=1, max_pairs=4,
                max_position=64, bases=ROPE_BASES) -> SearchStrategy[dict[str, Any]]:
    """dicts {x (B, H, T, D), positions (T,) int64, base}, in the order rope takes them; D = 2·pairs (even by construction).

    positions are T distinct integers in [0, max_position], in any order (a cache's positions are
    contiguous, but RoPE is a function of each position alone), drawn by rank so that none is rejected.
    Positions stay small by default so that an angle p·θ_0 = p carries little rounding in float32 (its
    error grows with p); bases are drawn from `bases`.
    """
    check_int_range("batch", min_batch, max_batch, low=1)
    check_int_range("heads", min_heads, max_heads, low=1)
    check_int_range("seq", min_seq, max_seq, low=1)
    check_int_range("pairs", min_pairs, max_pairs, low=1)
    check_int("max_position", max_position, low=max_seq - 1)
    bases = tuple(bases)
    if not bases:
        raise InvalidArgument("bases=() is empty; give at least one RoPE base, e.g. (10000.0,)")
    for base in bases:
        check_float("base", base, low=1.0000001)
    return _rope_inputs(min_batch, max_batch, min_heads, max_heads, min_seq, max_seq, min_pairs, max_pairs, max_position, bases)


def _unused_by_rank(ranks):
    """Distinct positions from ranks: the i-th is the ranks[i]-th smallest position not taken before it (0, 1, 2, ... for ranks of 0).

    Every rank is valid, so nothing is rejected (a unique list of drawn positions rejected up to
    45% of its examples), and ranks shrinking to 0 shrink the positions to a contiguous cache.
    """
    taken = []
    for rank in ranks:
        position = rank
        for used in sorted(taken):  # each taken position at or below the candidate pushes it up by one
            position += used <= position
        taken.append(position)
    return taken


@cache
def _rope_inputs(min_batch, max_batch, min_heads, max_heads, min_seq, max_seq, min_pairs, max_pairs, max_position, bases):
    @st.composite
    def inputs(draw):
        B, H = draw(integers(min_batch, max_batch)), draw(integers(min_heads, max_heads))
        T, D = draw(integers(min_seq, max_seq)), 2 * draw(integers(min_pairs, max_pairs))
        ranks = [draw(integers(0, max_position - i)) for i in range(T)]  # the i-th: which of the positions left
        positions = _unused_by_rank(ranks)
        rng = np.random.default_rng(draw(seeds()))
        return {"x": rng.standard_normal((B, H, T, D)), "positions": np.array(positions, dtype=np.int64), "base": draw(sampled_from(bases))}

    return inputs()


POSITION_PATTERNS = ("consecutive", "gaps", "resets", "left padding")  # shrinks towards consecutive
MAX_GAP = 4  # "gaps": each step from one position to the next in [1, MAX_GAP]


@cached_strategy
def position_runs(seq, *, max_start=64):
    """int64 positions (seq,) of a sequence as code meets them: "consecutive" from a start in [0, max_start] (one sequence, or a
    cache's next chunk), "gaps" (rising by 1 to MAX_GAP from that start: dropped tokens, speculative branches), "resets" (packed
    sequences, each from 0: Megatron's --reset-position-ids) and "left padding" (n >= 1 pads at position 1, then 0, 1, ...: the
    position_ids transformers builds from an attention mask).

    A uniform offset cancels in q·k, so only the last three tell code that reads `positions` from code that counts 0..T-1.
    """
    check_int("seq", seq, low=1)
    check_int("max_start", max_start, low=0)

    @st.composite
    def runs(draw):
        pattern = draw(sampled_from(POSITION_PATTERNS))
        if pattern == "resets" and seq > 1:
            cuts = sorted(draw(st.sets(integers(1, seq - 1), min_size=1)))  # where a new sequence starts
            return np.concatenate([np.arange(b - a) for a, b in zip([0, *cuts], [*cuts, seq], strict=True)]).astype(np.int64)
        if pattern == "left padding" and seq > 1:
            pads = draw(integers(1, seq - 1))
            return np.concatenate([np.ones(pads), np.arange(seq - pads)]).astype(np.int64)
        start = draw(integers(0, max_start))
        steps = draw(st.lists(integers(1, MAX_GAP), min_size=seq - 1, max_size=seq - 1)) if pattern == "gaps" else [1] * (seq - 1)
        return start + np.concatenate([[0], np.cumsum(steps, dtype=np.int64)]).astype(np.int64)

    return runs()


# -- grouped-query attention, masks, windows --------------------------------------------------------


@dataclass(frozen=True)
class GQAShape:
    """batch B, query heads H = n_kv_heads·group, queries T, keys S = T + cached, head width D."""

    batch: int
    n_kv_heads: int
    group: int
    seq: int
    cached: int
    d_head: int

    @property
    def n_heads(self):
        return self.n_kv_heads * self.group

    @property
    def keys(self):
        return self.seq + self.cached


@cached_strategy
def gqa_shapes(*, min_batch=1, max_batch=2, min_kv_heads=1, max_kv_heads=2, min_group=1, max_group=3, min_seq=1, max_seq=5,
               min_cached=0, max_cached=3, min_d_head=1, max_d_head=4) -> SearchStrategy[GQAShape]:
    """GQAShape with H = n_kv_heads·group (divisible by construction) and S = T + cached >= T.

    Shrinks towards one kv head, group 1 (multi-head), no cache (S = T), seq 1 and d_head 1;
    group = H with one kv head is multi-query attention.
    """
    check_int_range("batch", min_batch, max_batch, low=1)
    check_int_range("kv_heads", min_kv_heads, max_kv_heads, low=1)
    check_int_range("group", min_group, max_group, low=1)
    check_int_range("seq", min_seq, max_seq, low=1)
    check_int_range("cached", min_cached, max_cached, low=0)
    check_int_range("d_head", min_d_head, max_d_head, low=1)
    return st.builds(GQAShape, integers(min_batch, max_batch), integers(min_kv_heads, max_kv_heads), integers(min_group, max_group),
                     integers(min_seq, max_seq), integers(min_cached, max_cached), integers(min_d_head, max_d_head))


def key_mask_of(pattern, batch, keys, rng):
    """One (B, S) boolean key mask (True: the key may be seen) of `pattern`, drawn from rng.

    "random": each key hidden with probability 1/2, so rows with no visible key occur; "left padding"
    and "right padding": each item hides its first (last) n keys, n in [0, S]; "one item fully padded":
    item 0 hides every key, the others none.
    """
    if pattern == "random":
        return rng.random((batch, keys)) < 0.5
    if pattern in ("left padding", "right padding"):
        hidden = rng.integers(0, keys + 1, size=batch)[:, None]  # (B, 1): how many keys each item pads
        index = np.arange(keys)[None, :]
        return index >= hidden if pattern == "left padding" else index < keys - hidden
    if pattern == "one item fully padded":
        mask = np.ones((batch, keys), dtype=bool)
        mask[0] = False
        return mask
    raise InvalidArgument(f"pattern={pattern!r} is not one of {', '.join(map(repr, KEY_MASK_PATTERNS))}")


@cached_strategy
def gqa_inputs(*, shapes=None, causal=None, masked=None, windowed=None, patterns=KEY_MASK_PATTERNS, min_scale=1.0,
               max_scale=1.0) -> SearchStrategy[dict[str, Any]]:
    """dicts {q (B, H, T, D), k and v (B, H_kv, S, D), causal, key_mask, window}, in the order gqa_attention takes them.

    shapes: a strategy of GQAShape (default gqa_shapes()). causal, masked (a key mask, else None) and
    windowed (a window in [1, S + 1], else None; only with causal=True) are drawn where None, fixed
    where True or False. q and k are standard normal times a scale drawn from [min_scale, max_scale]
    (the scores q·k/√D are then of size scale²), v standard normal: with the default scale 1 no
    softmax weight underflows, even in float16, so "visible" and "non-zero" mean the same.
    """
    _check_choice_or_none("causal", causal)
    _check_choice_or_none("masked", masked)
    _check_choice_or_none("windowed", windowed)
    if windowed and causal is False:
        raise InvalidArgument("windowed=True needs causal attention: a sliding window is defined on causal attention only; pass causal=None or True")
    patterns = tuple(patterns)
    if not patterns:
        raise InvalidArgument("patterns=() is empty; give at least one of " + ", ".join(map(repr, KEY_MASK_PATTERNS)))
    for pattern in patterns:
        if pattern not in KEY_MASK_PATTERNS:
            raise InvalidArgument(f"pattern={pattern!r} is not one of {', '.join(map(repr, KEY_MASK_PATTERNS))}")
    _check_scales(min_scale, max_scale)
    shapes = gqa_shapes() if shapes is None else shapes

    @st.composite
    def inputs(draw):
        shape = draw(shapes)
        B, H, H_kv, T, S, D = shape.batch, shape.n_heads, shape.n_kv_heads, shape.seq, shape.keys, shape.d_head
        is_causal = draw(_booleans(causal))
        mask_pattern = draw(sampled_from(patterns)) if draw(_booleans(masked)) else None
        window = draw(integers(1, S + 1)) if is_causal and draw(_booleans(windowed)) else None
        scale = draw(_scales(min_scale, max_scale))
        rng = np.random.default_rng(draw(seeds()))
        return {
            "q": scale * rng.standard_normal((B, H, T, D)),  # (B, H, T, D)
            "k": scale * rng.standard_normal((B, H_kv, S, D)),  # (B, H_kv, S, D)
            "v": rng.standard_normal((B, H_kv, S, D)),  # (B, H_kv, S, D)
            "causal": is_causal,
            "key_mask": None if mask_pattern is None else key_mask_of(mask_pattern, B, S, rng),  # (B, S)
            "window": window,
        }

    return inputs()


def gqa_args(inputs):
    """The positional arguments of gqa_attention(q, k, v, causal, key_mask, window) from a gqa_inputs dict."""
    return tuple(inputs[name] for name in ("q", "k", "v", "causal", "key_mask", "window"))


# -- SwiGLU ---------------------------------------------------------------------------------------------


def swiglu_inputs(*, min_rows=1, max_rows=4, min_d_model=1, max_d_model=6, min_d_ff=1, max_d_ff=8) -> SearchStrategy[dict[str, np.ndarray]]:
    """dicts {x (N, d), W_gate (d, F), W_up (d, F), W_down (F, d)}; matrices of std 1/√fan_in, x standard normal."""
    check_int_range("rows", min_rows, max_rows, low=1)
    check_int_range("d_model", min_d_model, max_d_model, low=1)
    check_int_range("d_ff", min_d_ff, max_d_ff, low=1)
    return _swiglu_inputs(min_rows, max_rows, min_d_model, max_d_model, min_d_ff, max_d_ff)


@cache
def _swiglu_inputs(min_rows, max_rows, min_d_model, max_d_model, min_d_ff, max_d_ff):
    @st.composite
    def inputs(draw):
        N, d, F = draw(integers(min_rows, max_rows)), draw(integers(min_d_model, max_d_model)), draw(integers(min_d_ff, max_d_ff))
        rng = np.random.default_rng(draw(seeds()))
        return {"x": rng.standard_normal((N, d)), "W_gate": rng.standard_normal((d, F)) / np.sqrt(d),
                "W_up": rng.standard_normal((d, F)) / np.sqrt(d), "W_down": rng.standard_normal((F, d)) / np.sqrt(F)}

    return inputs()


# -- the Llama block and model -------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-shaped model: L blocks of H = n_kv_heads·group query heads of width D (even), d = H·D, SwiGLU width F."""

    vocab: int
    n_layers: int
    n_kv_heads: int
    group: int
    d_head: int
    d_ff: int
    rope_base: float
    window: int | None
    qkv_bias: bool

    @property
    def n_heads(self):
        return self.n_kv_heads * self.group

    @property
    def d_model(self):
        return self.n_heads * self.d_head


@cached_strategy
def llama_configs(*, min_vocab=2, max_vocab=10, min_layers=1, max_layers=2, max_kv_heads=2, min_group=1, max_group=2, min_pairs=1,
                  max_pairs=2, max_d_ff=10, windowed=None, min_window=1, max_window=6, qkv_bias=None,
                  bases=ROPE_BASES) -> SearchStrategy[LlamaConfig]:
    """LlamaConfig with H divisible by H_kv, D = 2·pairs and d_model = H·D (as in Llama, Mistral and Qwen2; the reference takes any d).

    windowed=None draws configs with and without a sliding window (w in [min_window, max_window]); qkv_bias=None
    draws both (Qwen2 has q/k/v biases). Shrinks towards one layer, one kv head, group 1, D = 2.
    """
    check_int_range("vocab", min_vocab, max_vocab, low=1)
    check_int_range("layers", min_layers, max_layers, low=0)
    check_int("max_kv_heads", max_kv_heads, low=1)
    check_int_range("group", min_group, max_group, low=1)
    check_int_range("pairs", min_pairs, max_pairs, low=1)
    check_int("max_d_ff", max_d_ff, low=1)
    check_int_range("window", min_window, max_window, low=1)
    _check_choice_or_none("windowed", windowed)
    _check_choice_or_none("qkv_bias", qkv_bias)
    bases = tuple(bases)
    for base in bases:
        check_float("base", base, low=1.0000001)

    @st.composite
    def configs(draw):
        H_kv, group, D = draw(integers(1, max_kv_heads)), draw(integers(min_group, max_group)), 2 * draw(integers(min_pairs, max_pairs))
        return LlamaConfig(
            vocab=draw(integers(min_vocab, max_vocab)), n_layers=draw(integers(min_layers, max_layers)), n_kv_heads=H_kv, group=group,
            d_head=D, d_ff=draw(integers(1, max_d_ff)), rope_base=draw(sampled_from(bases)),
            window=draw(integers(min_window, max_window)) if draw(_booleans(windowed)) else None, qkv_bias=draw(_booleans(qkv_bias)),
        )

    return configs()


def init_llama_block_params(config, seed) -> dict[str, np.ndarray]:
    """One Llama block's params from `seed`: attn_norm W_q W_k W_v W_o ffn_norm W_gate W_up W_down (+ b_q b_k b_v where config.qkv_bias).

    Matrices standard normal / √fan_in, norm gains uniform in [0.5, 1.5], biases N(0, 0.2²).
    """
    if not isinstance(config, LlamaConfig):
        raise InvalidArgument(f"config={config!r} must be a LlamaConfig")
    d, F, q_width, kv_width = config.d_model, config.d_ff, config.n_heads * config.d_head, config.n_kv_heads * config.d_head
    rng = np.random.default_rng(seed)

    def matrix(fan_in, fan_out):
        return rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)

    params = {
        "attn_norm": rng.uniform(0.5, 1.5, d),  # (d,)
        "W_q": matrix(d, q_width), "W_k": matrix(d, kv_width), "W_v": matrix(d, kv_width),  # (d, H·D), (d, H_kv·D) twice
        "W_o": matrix(q_width, d),  # (H·D, d)
        "ffn_norm": rng.uniform(0.5, 1.5, d),  # (d,)
        "W_gate": matrix(d, F), "W_up": matrix(d, F), "W_down": matrix(F, d),  # (d, F), (d, F), (F, d)
    }
    if config.qkv_bias:
        params.update(b_q=BIAS_STD * rng.standard_normal(q_width), b_k=BIAS_STD * rng.standard_normal(kv_width),
                      b_v=BIAS_STD * rng.standard_normal(kv_width))
    return params


@cached_strategy
def llama_block_params(config) -> SearchStrategy[dict[str, np.ndarray]]:
    """Params dicts for one block of `config` (see init_llama_block_params)."""
    if not isinstance(config, LlamaConfig):
        raise InvalidArgument(f"config={config!r} must be a LlamaConfig; draw one from llama_configs()")
    return mapped(seeds(), partial(init_llama_block_params, config))  # built once per config


def init_llama_params(config, seed) -> dict[str, Any]:
    """A model's params from `seed`: embed (V, d), blocks [...], norm (d,), W_out (d, V) (an untied head)."""
    if not isinstance(config, LlamaConfig):
        raise InvalidArgument(f"config={config!r} must be a LlamaConfig")
    rng = np.random.default_rng(seed)
    block_seeds = rng.integers(0, 2**32, size=config.n_layers)
    return {
        "embed": rng.standard_normal((config.vocab, config.d_model)),  # (V, d)
        "blocks": [init_llama_block_params(config, int(s)) for s in block_seeds],
        "norm": rng.uniform(0.5, 1.5, config.d_model),  # (d,)
        "W_out": rng.standard_normal((config.d_model, config.vocab)) / np.sqrt(config.d_model),  # (d, V)
    }


@cached_strategy
def llama_params(config) -> SearchStrategy[dict[str, Any]]:
    """Params trees for a model of `config` (see init_llama_params)."""
    if not isinstance(config, LlamaConfig):
        raise InvalidArgument(f"config={config!r} must be a LlamaConfig; draw one from llama_configs()")
    return mapped(seeds(), partial(init_llama_params, config))


def decode_schedules(seq, *, min_chunks=1, max_prefill=None, max_chunk=None, straddling=None) -> SearchStrategy[list[int]]:
    """int64 arrays of at least min_chunks chunk sizes, each >= 1, summing to `seq`: a prefill then the further chunks, split anywhere.

    Generates on purpose the one-chunk schedule (a plain forward, where min_chunks is 1), token by
    token after a one-token prefill, and any composition of seq; shrinks towards the fewest chunks.
    max_prefill and max_chunk (the prefill's and every later chunk's most tokens, None for no limit)
    narrow every schedule to what an implementation supports. straddling=w draws only the splits
    that straddle a window's edge, where ring and trimmed window caches break: a prefill shorter than
    w, then a chunk of 2 to w tokens whose last position is w or later (w >= 2, seq > w).
    """
    check_int("seq", seq, low=1)
    check_int("min_chunks", min_chunks, low=1)
    check_order("min_chunks", min_chunks, "seq", seq)
    for name, value in (("max_prefill", max_prefill), ("max_chunk", max_chunk), ("straddling", straddling)):
        if value is not None:
            check_int(name, value, low=1)
    if straddling is not None:
        longest = straddling if max_chunk is None else min(straddling, max_chunk)
        if straddling < 2 or seq <= straddling or min_chunks > 2 or longest < 2 or straddling + 1 - longest > (max_prefill or seq):
            raise InvalidArgument(f"straddling={straddling} needs 2 <= w < seq={seq}, min_chunks={min_chunks} <= 2, chunks of 2 or more "
                                  f"(max_chunk={max_chunk}) and a prefill that a chunk can carry past w (max_prefill={max_prefill})")
        return _window_edge_schedules(seq, straddling, max_prefill, max_chunk)
    return _decode_schedules(seq, min_chunks, max_prefill, max_chunk)


@cache
def _decode_schedules(seq, min_chunks, max_prefill, max_chunk):
    def chunks(cuts):
        edges = [0, *sorted(cuts), seq]
        return np.diff(np.array(edges, dtype=np.int64))

    if max_prefill is None and max_chunk is None:
        # Built once per (seq, min_chunks); hypothesis's own just(), since one_of draws a shared strategy once, not once per branch.
        token_by_token = st.just(frozenset(range(1, seq)))
        cut_points = st.sets(integers(1, seq - 1), min_size=min_chunks - 1) if seq > 1 else st.just(frozenset())
        schedules = [st.just(frozenset())] if min_chunks == 1 else []
        return st.one_of(*schedules, cut_points, token_by_token).map(chunks)
    return _limited_schedules(seq, min_chunks, max_prefill, max_chunk)


@cache
def _window_edge_schedules(seq, window, max_prefill, max_chunk):
    longest = window if max_chunk is None else min(window, max_chunk)
    prefill_max = window - 1 if max_prefill is None else min(window - 1, max_prefill)

    @st.composite
    def straddling(draw):
        prefill = draw(integers(max(1, window + 1 - longest), prefill_max))  # a chunk of `longest` tokens can still pass w - 1
        chunk = draw(integers(max(2, window + 1 - prefill), min(longest, seq - prefill)))
        rest = draw(_limited_schedules(seq - prefill - chunk, 1, max_chunk, max_chunk)) if seq > prefill + chunk else []
        return np.array([prefill, chunk, *rest], dtype=np.int64)

    return straddling()


@cache
def _limited_schedules(seq, min_chunks, max_prefill, max_chunk):
    """Schedules whose prefill holds at most max_prefill tokens and every later chunk at most max_chunk (None: any)."""
    first = seq if max_prefill is None else min(seq, max_prefill)
    later = seq if max_chunk is None else max_chunk

    @st.composite
    def limited(draw):
        prefill = draw(integers(1, min(first, seq - min_chunks + 1)))
        sizes, left = [prefill], seq - prefill
        while left:
            size = draw(integers(1, min(later, left - max(0, min_chunks - 1 - len(sizes)))))  # shrinks towards one-token steps
            sizes.append(size)
            left -= size
        return np.array(sizes, dtype=np.int64)

    return limited()


# -- cross-attention and the decoder block ------------------------------------------------------------


def cross_inputs(*, min_batch=1, max_batch=2, min_seq=1, max_seq=4, min_memory=1, max_memory=4, min_heads=1, max_heads=2, min_d_head=1,
                 max_d_head=3) -> SearchStrategy[dict[str, Any]]:
    """dicts {x (B, T, d), memory (B, S, d), W_q, W_k, W_v, W_o (d, d), n_heads}, in the order cross_attention takes them.

    T decoder positions and S encoder positions are drawn independently (S < T, S = T, S > T all occur);
    d = n_heads·d_head; projections of std 1/√d, inputs standard normal.
    """
    for prefix, low, high in (("batch", min_batch, max_batch), ("seq", min_seq, max_seq), ("memory", min_memory, max_memory),
                              ("heads", min_heads, max_heads), ("d_head", min_d_head, max_d_head)):
        check_int_range(prefix, low, high, low=1)
    return _cross_inputs(min_batch, max_batch, min_seq, max_seq, min_memory, max_memory, min_heads, max_heads, min_d_head, max_d_head)


@cache
def _cross_inputs(min_batch, max_batch, min_seq, max_seq, min_memory, max_memory, min_heads, max_heads, min_d_head, max_d_head):
    @st.composite
    def inputs(draw):
        B, T, S = draw(integers(min_batch, max_batch)), draw(integers(min_seq, max_seq)), draw(integers(min_memory, max_memory))
        H = draw(integers(min_heads, max_heads))
        d = H * draw(integers(min_d_head, max_d_head))
        rng = np.random.default_rng(draw(seeds()))
        drawn = {"x": rng.standard_normal((B, T, d)), "memory": rng.standard_normal((B, S, d))}
        for name in ("W_q", "W_k", "W_v", "W_o"):
            drawn[name] = rng.standard_normal((d, d)) / np.sqrt(d)
        drawn["n_heads"] = H
        return drawn

    return inputs()


def cross_args(inputs):
    """The positional arguments of cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads) from a cross_inputs dict."""
    return tuple(inputs[name] for name in ("x", "memory", "W_q", "W_k", "W_v", "W_o", "n_heads"))


def init_decoder_block_params(d_model, seed, *, d_ff=None) -> dict[str, np.ndarray]:
    """One decoder block's params from `seed`: ln1_g ln1_b W_q W_k W_v W_o, ln2_g ln2_b Wc_q Wc_k Wc_v Wc_o, ln3_g ln3_b W1 b1 W2 b2.

    Matrices standard normal / √fan_in, gains uniform in [0.5, 1.5], biases N(0, 0.2²); d_ff defaults to 4·d_model.
    """
    check_int("d_model", d_model, low=1)
    d, F = d_model, 4 * d_model if d_ff is None else d_ff
    check_int("d_ff", F, low=1)
    rng = np.random.default_rng(seed)

    def matrix(fan_in, fan_out):
        return rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)

    def bias(n):
        return BIAS_STD * rng.standard_normal(n)

    params = {}
    for norm in ("ln1", "ln2", "ln3"):
        params[f"{norm}_g"], params[f"{norm}_b"] = rng.uniform(0.5, 1.5, d), bias(d)  # (d,) each
    for name in ("W_q", "W_k", "W_v", "W_o", "Wc_q", "Wc_k", "Wc_v", "Wc_o"):
        params[name] = matrix(d, d)  # (d, d)
    params.update(W1=matrix(d, F), b1=bias(F), W2=matrix(F, d), b2=bias(d))  # (d, F), (F,), (F, d), (d,)
    return params


@cached_strategy
def decoder_block_params(d_model, *, d_ff=None) -> SearchStrategy[dict[str, np.ndarray]]:
    """Params dicts for one encoder-decoder decoder block of width d_model (see init_decoder_block_params)."""
    check_int("d_model", d_model, low=1)
    if d_ff is not None:
        check_int("d_ff", d_ff, low=1)
    return mapped(seeds(), partial(init_decoder_block_params, d_model, d_ff=d_ff))


# -- attention with QK-norm --------------------------------------------------------------------------------


@cached_strategy
def qk_norm_inputs(*, min_batch=1, max_batch=2, min_seq=1, max_seq=5, max_kv_heads=2, min_group=1, max_group=2, min_pairs=1, max_pairs=3,
                   max_d_model=6, max_start=64, bases=ROPE_BASES, min_qk_scale=1.0, max_qk_scale=1.0) -> SearchStrategy[dict[str, Any]]:
    """dicts {x (B, T, d), params, n_heads, n_kv_heads, positions (T,), rope_base}, in the order qk_norm_attention takes them.

    H = n_kv_heads·group, D = 2·pairs, and d in [1, max_d_model] drawn apart from H·D (Qwen3's d is not H·D).
    params: W_q (d, H·D), W_k and W_v (d, H_kv·D), W_o (H·D, d), standard normal / √fan_in, W_q and W_k
    times a scale from [min_qk_scale, max_qk_scale] (a power of two where the range holds one: large
    scales are where attention without the norm saturates); q_norm and k_norm (D,) uniform in [0.5, 1.5],
    so the two gains of a RoPE pair differ. positions (T,): one of POSITION_PATTERNS (see position_runs), from a start in [0, max_start].
    """
    for prefix, low, high in (("batch", min_batch, max_batch), ("seq", min_seq, max_seq), ("group", min_group, max_group),
                              ("pairs", min_pairs, max_pairs)):
        check_int_range(prefix, low, high, low=1)
    check_int("max_kv_heads", max_kv_heads, low=1)
    check_int("max_d_model", max_d_model, low=1)
    check_int("max_start", max_start, low=0)
    _check_scales(min_qk_scale, max_qk_scale)
    bases = tuple(bases)
    for base in bases:
        check_float("base", base, low=1.0000001)
    qk_scales = scales(min_qk_scale, max_qk_scale)

    @st.composite
    def inputs(draw):
        B, T = draw(integers(min_batch, max_batch)), draw(integers(min_seq, max_seq))
        H_kv, group, D = draw(integers(1, max_kv_heads)), draw(integers(min_group, max_group)), 2 * draw(integers(min_pairs, max_pairs))
        d, base, scale = draw(integers(1, max_d_model)), draw(sampled_from(bases)), draw(qk_scales)
        positions = draw(position_runs(T, max_start=max_start))
        rng = np.random.default_rng(draw(seeds()))

        def matrix(fan_in, fan_out, gain=1.0):
            return gain * rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)

        H = H_kv * group
        params = {"W_q": matrix(d, H * D, scale), "W_k": matrix(d, H_kv * D, scale), "W_v": matrix(d, H_kv * D),  # (d, H·D), (d, H_kv·D) twice
                  "W_o": matrix(H * D, d), "q_norm": rng.uniform(0.5, 1.5, D), "k_norm": rng.uniform(0.5, 1.5, D)}  # (H·D, d), (D,) twice
        return {"x": rng.standard_normal((B, T, d)), "params": params, "n_heads": H, "n_kv_heads": H_kv,
                "positions": positions, "rope_base": base}

    return inputs()


def qk_norm_args(inputs):
    """The positional arguments of qk_norm_attention(x, params, n_heads, n_kv_heads, positions, rope_base) from a qk_norm_inputs dict."""
    return tuple(inputs[name] for name in ("x", "params", "n_heads", "n_kv_heads", "positions", "rope_base"))
