"""Invariants of StreamingLLM's rolling cache: the first n_sink tokens (the attention sinks) and a window, RoPE within the cache.

streaming_attention(q, k, v, n_sink, cache_size, rope_base) is causal GQA in which query t sees exactly the keys a cache of
cache_size slots holds at its step: the first n_sink and the last cache_size - n_sink (all of them while t < cache_size), at
RoPE positions 0 .. m - 1 within the cache and the query at m - 1 (Xiao et al. 2023, §3.2); streaming_decode runs it one token
at a time on the implementation's own cache and answers what its slots hold. The laws: a query sees exactly the sinks and
the window (exactly: nothing else moves it); with no sinks it is the plain sliding window; a query past the cache sees what the
last query of a fresh stream of its cache's tokens sees (the positions are the cache's, not the text's); the reference agrees;
decoding equals the whole stream at once; the cache holds every token the next query needs, the sinks first among them, and
nothing the current query did not see. Sources: invariants/protocol.py (STREAMING_DETAILS) and invariants/reference/numpy.py.
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_where
from invariants.conventions import declared
from invariants.inputs import valid_inputs
from invariants.laws.gqa import value_scale
from invariants.laws.reference_check import reference_tolerance
from invariants.laws.rope import assert_close_to_a_pairing, rope_pairings
from invariants.protocol import FUNCTIONS, ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import integers
from invariants.strategies.streaming import streaming_inputs

LESSON = 143  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("streaming_attention", "streaming_decode")  # the protocol functions whose laws it holds

STREAMING, DECODE = FUNCTIONS["streaming_attention"], FUNCTIONS["streaming_decode"]


def draw_stream(impl, case, **options):
    """streaming_inputs(**options) for impl: its ROPE_THETA as the only base where it declares one."""
    if declared(impl, "ROPE_THETA") is not None:
        options["bases"] = (declared(impl, "ROPE_THETA"),)
    return case.draw(streaming_inputs(**options), "stream")


def held_mask(T, n_sink, cache_size, *, first=0):
    """(T, T + first) bool: row t marks the tokens the cache holds once token t + first is in (what query t + first sees)."""
    mask = np.zeros((T, T + first), dtype=bool)
    for t in range(T):
        mask[t, ref.streaming_held(t + first, n_sink, cache_size)] = True
    return mask


def _tolerances(impl, inputs, tol):
    return {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))}


def _own_tolerances(impl, inputs):
    """Two of impl's own answers compared: its dtype's tolerance times the function's rounding budget, twice over."""
    return _tolerances(impl, inputs, impl.tolerance.scaled(2 * ROUNDINGS["streaming_attention"]))


@valid_inputs("streaming_attention")
def streaming_attention_arguments(impl, case):
    """A stream of up to 4 tokens past a cache of 0 to 4 sinks and a window of 1 to 4 slots, before RoPE, and the declared base."""
    return STREAMING.arguments_of(draw_stream(impl, case))


@valid_inputs("streaming_decode")
def streaming_decode_arguments(impl, case):
    """streaming_attention's arguments."""
    return DECODE.arguments_of(draw_stream(impl, case))


@invariant(
    requires=("streaming_attention",),
    hint=(
        "a query sees other keys than the first n_sink and the last cache_size - n_sink: the sinks evicted with the window "
        "(nomic-ai/gpt4all#956: the BOS erased), one sink too many (llama.cpp#5622: n_keep + 1), the newest tokens evicted "
        "instead of the oldest (JaydenLyh/Reward-Forcing#5), a window one too wide, or a future key"
    ),
)
def streaming_sees_sinks_and_window(impl, case):
    """Query t's weights are non-zero exactly on the first n_sink keys and the last cache_size - n_sink up to t, and changing every
    other key and value leaves its output and weights exactly equal."""
    inputs = draw_stream(impl, case)
    q, k, v, n_sink, cache_size = (inputs[name] for name in ("q", "k", "v", "n_sink", "cache_size"))
    T = q.shape[2]
    t = case.draw(integers(0, T - 1), "query t")
    call = describe_call("streaming_attention", inputs, f"query {t} with the keys its cache does not hold changed")
    out, weights = STREAMING.called(impl, inputs, call)
    seen = held_mask(T, n_sink, cache_size)  # (T, T)
    if weights is not None:
        assert_where((weights != 0) == seen, weights, "streaming_attention weights",
                     f"non-zero exactly on the first {n_sink} keys and the last {cache_size - n_sink} up to each query", call)
    unseen = ~seen[t]  # (T,)
    changed = dict(k=np.where(unseen[:, None], -3 * k + 1, k), v=np.where(unseen[:, None], v + 5, v))
    again = STREAMING.called(impl, inputs, call, **changed)
    STREAMING.assert_parts(again, (out, weights), f"of query {t}", call, select=lambda part, value: value[:, :, t])


@invariant(
    requires=("streaming_attention",),
    hint="with n_sink = 0 the cache is not the plain sliding window of cache_size keys, itself included: the window one too wide "
    "(sgl-project/sglang#26147, transformers#39408) or too narrow, or the keys' distances to the query not their distances in the text",
)
def streaming_without_sinks_is_sliding_window(impl, case):
    """With n_sink = 0, streaming_attention is gqa_attention with window = cache_size on rope's queries and keys at 0 .. T - 1
    (the float64 reference's, in impl's RoPE pairing)."""
    inputs = draw_stream(impl, case, max_sinks=0)
    call = describe_call("streaming_attention", inputs, f"vs gqa_attention(rope(q), rope(k), v, causal, window={inputs['cache_size']})")
    out, weights = STREAMING.called(impl, inputs, call)
    q, k, v = impl.as_seen((inputs["q"], inputs["k"], inputs["v"]))
    positions = np.arange(q.shape[2])
    windowed = {p: ref.gqa_attention(ref.rope(q, positions, inputs["rope_base"], pairing=p), ref.rope(k, positions, inputs["rope_base"], pairing=p),
                                     v, True, None, inputs["cache_size"]) for p in rope_pairings(impl)}
    tol = _tolerances(impl, inputs, reference_tolerance(impl, factor=ROUNDINGS["streaming_attention"]))
    if weights is not None:
        assert_close_to_a_pairing(impl, weights, {p: w for p, (_, w) in windowed.items()}, "streaming_attention weights with n_sink = 0",
                                  tol["weights"], call)
    assert_close_to_a_pairing(impl, out, {p: o for p, (o, _) in windowed.items()}, "streaming_attention output with n_sink = 0",
                              tol["out"], call)


@invariant(
    requires=("streaming_attention",),
    hint="RoPE at the positions in the text, not within the cache: the sinks as far from a late query as in the text, keys not "
    "re-rotated when the window shifts or new keys at their text positions (transformers#33691, #31581), or the sinks rotated twice",
)
def streaming_positions_within_the_cache(impl, case):
    """A query t past the cache gives the output and weights the last query of a fresh stream of the tokens its cache holds gives
    (to rounding): positions are the cache's, so a query sees its cache as if the stream had started with it."""
    inputs = draw_stream(impl, case, min_sinks=1, min_past=1)
    T, n_sink, cache_size = inputs["q"].shape[2], inputs["n_sink"], inputs["cache_size"]
    t = case.draw(integers(cache_size, T - 1), "query t (past the cache)")
    held = ref.streaming_held(t, n_sink, cache_size)
    fresh = {**inputs, **{name: inputs[name][:, :, held] for name in ("q", "k", "v")}}
    call = describe_call("streaming_attention", inputs, f"query {t} vs the last query of the stream of its cache's tokens {held}")
    out, weights = STREAMING.called(impl, inputs, call)
    fresh_out, fresh_weights = STREAMING.called(impl, fresh, call)
    got = (out[:, :, t], None if weights is None else weights[:, :, t][..., held])
    expected = (fresh_out[:, :, -1], None if fresh_weights is None else fresh_weights[:, :, -1])
    STREAMING.assert_parts(got, expected, f"of query {t} vs the fresh stream's last", call, _own_tolerances(impl, inputs))


@invariant(
    requires=("streaming_attention",),
    hint="the streaming attention differs from the protocol's: query t sees the first n_sink keys and the last cache_size - n_sink "
    "at RoPE positions 0 .. m - 1 within the cache and itself at m - 1, scale 1/√D, kv head g serving query heads g·group ..",
)
def streaming_attention_agrees_with_reference(impl, case):
    """streaming_attention agrees with the float64 reference in its RoPE pairing (1e-10 in float64, the dtype tolerance otherwise)."""
    inputs = draw_stream(impl, case)
    call = describe_call("streaming_attention", inputs)
    out, weights = STREAMING.called(impl, inputs, call)
    seen = impl.as_seen(inputs)
    answers = {p: ref.streaming_attention(seen["q"], seen["k"], seen["v"], inputs["n_sink"], inputs["cache_size"], inputs["rope_base"],
                                          pairing=p) for p in rope_pairings(impl)}
    tol = _tolerances(impl, inputs, reference_tolerance(impl, factor=ROUNDINGS["streaming_attention"]))
    if weights is not None:
        assert_close_to_a_pairing(impl, weights, {p: w for p, (_, w) in answers.items()}, "streaming_attention weights", tol["weights"], call)
    assert_close_to_a_pairing(impl, out, {p: o for p, (o, _) in answers.items()}, "streaming_attention output", tol["out"], call)


@invariant(
    requires=("streaming_decode", "streaming_attention"),
    hint="the rolling cache breaks what the whole stream computes: cached keys not re-rotated when the window shifts, or new keys "
    "rotated at their positions in the text while the cached ones are shifted (transformers#33691), or the wrong key evicted",
)
def streaming_decode_matches_attention(impl, case):
    """Decoding the stream token by token on the cache gives streaming_attention's output at every token, to rounding."""
    inputs = draw_stream(impl, case, min_past=1)
    call = describe_call("streaming_decode", inputs, "vs streaming_attention on the whole stream")
    decoded, _ = DECODE.called(impl, inputs, call)
    whole, _ = STREAMING.called(impl, inputs, call)
    STREAMING.assert_parts((decoded, None), (whole, None), "decoded token by token", call, _own_tolerances(impl, inputs))


@invariant(
    requires=("streaming_decode",),
    hint="the cache does not hold what StreamingLLM keeps: a sink evicted, a token the next query needs dropped, a token held "
    "twice, or a cache never trimmed (vivekkalyanarangan30/llm_from_scratch#3: every key kept, the attention masked)",
)
def streaming_cache_law(impl, case):
    """Once token t is in, the cache holds each of the first n_sink tokens and the last cache_size - n_sink - 1 (what query t + 1
    needs), and nothing query t did not see, none twice: at most cache_size tokens."""
    inputs = draw_stream(impl, case, min_past=1)
    T, n_sink, cache_size = inputs["q"].shape[2], inputs["n_sink"], inputs["cache_size"]
    call = describe_call("streaming_decode", inputs)
    _, held = DECODE.called(impl, inputs, call)
    assert_where((held == -1) | ((held >= 0) & (held < np.arange(T)[:, None] + 1)), held, "streaming_decode held",
                 "-1 (an empty slot) or a token already in (0 .. t)", call)
    times = (held[..., None] == np.arange(T + 1)).sum(axis=1)  # (T, T + 1): how often each token is held once token t is in
    seen = np.pad(held_mask(T, n_sink, cache_size), ((0, 0), (0, 1)))  # (T, T + 1): what query t sees (never token t + 1)
    needed = held_mask(T, n_sink, cache_size, first=1)  # (T, T + 1): what query t + 1 sees
    needed[np.arange(T), np.arange(T) + 1] = False  # but itself, which comes after
    assert_where((times <= seen) & (times >= needed), times, "how often each token is held once token t is in",
                 f"once for the first {n_sink} and the last {cache_size - n_sink - 1} tokens, never a token query t did not see", call)
