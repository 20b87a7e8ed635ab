"""The streaming laws held to code nobody here wrote: attention_sinks 0.4.0's AttentionSinkKVCache (tests/fixtures/streaming, see NOTICE),
loaded by path, the cache of tomaarsen/attention_sinks and, renamed, of mit-han-lab/streaming-llm (StartRecentKVCache).

The class keeps, along the sequence axis of each [key, value] pair, the first attention_sink_size positions and the last
attention_sink_window_size; its cache_size is their sum. `cache(past)` trims a cache longer than that, `cache.evict_for_space(past,
n)` trims one so that n more fit. Which keys a query sees depends on when the cache is trimmed, so there are two adapters, one for
each way its authors use it (mit-han-lab/streaming-llm#48, Guangxuan Xiao: token-by-token eviction as in the paper's perplexity
runs, or room made for the tokens coming):

- TrimAfterStep: attention_sinks' models trim the cache each forward returns (inject_mixin: past = cache(outputs.past_key_values)),
  as streaming-llm's examples/eval_long_ppl.py does after each token. The cache holds the class's cache_size tokens between steps
  and a query sees them and itself, so the protocol's n_sink and cache_size are attention_sink_size = n_sink and
  attention_sink_window_size = cache_size - n_sink - 1. held[t] (after the trim) is the cache_size - 1 tokens query t + 1 needs:
  the fewest the cache law allows.
- EvictBeforeStep: streaming-llm's examples/run_streaming_llama.py makes room before the tokens go in (evict_for_space(past,
  tokens coming)), here one token at a time. The class's cache_size is then the protocol's (attention_sink_window_size =
  cache_size - n_sink), and held[t] is the cache_size tokens query t saw: the most the cache law allows.

Both attend as attention_sinks' pos_shift attention does (models/llama/pos_shift.py; written here, not copied): keys are cached
before RoPE and rotated at their slots 0 .. m - 1 at every step, the query at m - 1 (its position id is the length of the cache it
joins); Llama's rotate_half pairing (ROPE_PAIRING = "half_split"), scale 1/√D, kv head g serving query heads g·group .. g·group +
group - 1 (repeat_kv). streaming_attention, the same for both, trims each query's whole prefix at once with the class's `cache(past)`
(as the package trims the cache a prompt's forward leaves) at the protocol's cache_size, so that decoding (the class step by step)
and the whole stream (the class at once) are two uses of it that streaming_decode_matches_attention compares. The class slices
every layer of the cache alike: a second layer holding the token numbers says which tokens it keeps (held, and where the weights go).

The ci profile, float32: zero false alarms.
"""

import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from invariants import REGISTRY, Implementation, all_invariants, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

VENDORED = Path(__file__).parent / "fixtures" / "streaming" / "attention_sink_kv_cache.py"
_SPEC = importlib.util.spec_from_file_location("attention_sink_kv_cache", VENDORED)
attention_sink_kv_cache = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(attention_sink_kv_cache)
AttentionSinkKVCache = attention_sink_kv_cache.AttentionSinkKVCache

all_invariants()
CI = profile_settings("ci")


def _rotated(x, slots, base):
    """x (..., m, D) rotated at `slots` (m,) as Llama's rotate_half RoPE does: pairs (i, i + D/2), angle slot · base^(-2i/D)."""
    D = x.shape[-1]
    angles = torch.outer(slots.double(), base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D))  # (m, D/2)
    cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)  # (m, D)
    half = torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1)
    return x * cos + half * sin


def _attend(query, keys, values, rope_base):
    """pos_shift's attention of the query (B, H, 1, D) at the cache's last slot m - 1 over keys and values (B, H_kv, m, D) cached
    before RoPE, the keys rotated at slots 0 .. m - 1 -> out (B, H, 1, D), weights (B, H, 1, m)."""
    m, group = keys.shape[2], query.shape[1] // keys.shape[1]
    slots = torch.arange(m)
    query, keys = _rotated(query, slots[-1:], rope_base), _rotated(keys, slots, rope_base)
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)  # (B, H, m, D): kv head g, query heads g·group ..
    weights = torch.softmax(query @ keys.transpose(-1, -2) / math.sqrt(query.shape[-1]), dim=-1)  # (B, H, 1, m)
    return weights @ values, weights


def _past(keys, values, first):
    """The cache the class trims, keys and values (B, H_kv, S, D) of tokens first .. first + S - 1: [[keys, values], [numbers,
    numbers]], the numbers (1, 1, S, 1) a layer of their own, so that what the class keeps of them is what it keeps of the keys."""
    numbers = torch.arange(first, first + keys.shape[2]).view(1, 1, -1, 1)
    return [[keys, values], [numbers, numbers]]


def _appended(past, later):
    return later if past is None else [[torch.cat([a, b], 2) for a, b in zip(old, new, strict=True)] for old, new in zip(past, later, strict=True)]


def _tokens(past):
    return past[1][0].flatten()


def streaming_attention(q, k, v, n_sink, cache_size, rope_base):
    """Query t attends tokens 0 .. t as AttentionSinkKVCache(n_sink, cache_size - n_sink) trims them in one call, with pos_shift's
    positions: q (B, H, T, D), k and v (B, H_kv, T, D) -> out (B, H, T, D), weights (B, H, T, T) (0 where the cache let go)."""
    B, H, T, _ = q.shape
    cache = AttentionSinkKVCache(attention_sink_size=n_sink, attention_sink_window_size=cache_size - n_sink)
    out, weights = torch.zeros_like(q), q.new_zeros(B, H, T, T)
    for t in range(T):
        past = cache(_past(k[:, :, : t + 1], v[:, :, : t + 1], 0))
        out[:, :, t : t + 1], weights[:, :, t : t + 1, _tokens(past)] = _attend(q[:, :, t : t + 1], *past[0], rope_base)
    return out, weights


def _unchanged(cache, past):
    return past


def _decoding(window, *, before=_unchanged, after=_unchanged):
    """streaming_decode on AttentionSinkKVCache(n_sink, window(n_sink, cache_size)): before(cache, past) ahead of each token,
    after(cache, past) once it is attended."""

    def streaming_decode(q, k, v, n_sink, cache_size, rope_base):
        """(out (B, H, T, D), held (T, slots) int64, -1 for an empty slot): each token appended before RoPE, its query attending the cache."""
        cache = AttentionSinkKVCache(attention_sink_size=n_sink, attention_sink_window_size=window(n_sink, cache_size))
        out, held, past = torch.zeros_like(q), [], None
        for t in range(q.shape[2]):
            past = _appended(before(cache, past), _past(k[:, :, t : t + 1], v[:, :, t : t + 1], t))
            out[:, :, t : t + 1] = _attend(q[:, :, t : t + 1], *past[0], rope_base)[0]
            past = after(cache, past)
            held.append(_tokens(past))
        slots = torch.full((len(held), max(len(tokens) for tokens in held)), -1, dtype=torch.int64)
        for t, tokens in enumerate(held):
            slots[t, : len(tokens)] = tokens
        return out, slots

    return streaming_decode


def _adapter(name, streaming_decode):
    return type(name, (), {"BACKEND": "torch", "ROPE_PAIRING": "half_split", "streaming_attention": staticmethod(streaming_attention),
                           "streaming_decode": staticmethod(streaming_decode)})


def _trimmed(cache, past):
    return cache(past)


def _room_for_one(cache, past):
    return cache.evict_for_space(past, 1)


TrimAfterStep = _adapter("TrimAfterStep", _decoding(lambda n_sink, cache_size: cache_size - n_sink - 1, after=_trimmed))
EvictBeforeStep = _adapter("EvictBeforeStep", _decoding(lambda n_sink, cache_size: cache_size - n_sink, before=_room_for_one))

# every law that needs nothing but the streaming functions: the six of invariants/laws/streaming.py, the answers' shapes, dtypes, finiteness;
# those of streaming_attention alone once (the adapters share it), those of streaming_decode on each
LAWS = sorted(name for name, law in REGISTRY.items() if law.requires and set(law.requires) <= {"streaming_attention", "streaming_decode"})
CASES = [(adapter, name) for name in LAWS for adapter in ("TrimAfterStep", "EvictBeforeStep")
         if adapter == "TrimAfterStep" or "streaming_decode" in REGISTRY[name].requires]


def _implementation(adapter, label=None):
    return Implementation(adapter, label=label or adapter.__name__, backend="torch", dtype="float32")


@pytest.mark.parametrize(("adapter", "name"), CASES, ids=[f"{adapter}-{name}" for adapter, name in CASES])
def test_attention_sinks_cache_passes_the_streaming_laws_at_ci(adapter, name):
    outcome = run_invariant(REGISTRY[name], _implementation(globals()[adapter]), settings=CI)
    assert outcome.status == "passed", outcome.report or outcome.reason


def test_both_mappings_give_the_papers_example():
    """Xiao et al. §3.2: 4 sinks, a query at slot 7 (cache_size 8) decoding token 9 over the cache [0, 1, 2, 3, 6, 7, 8]. Trimmed after
    each step (attention_sink_window_size 3) the class holds those 7 once token 8 is in; making room first (window 4), those and 9
    once 9 is."""
    q = k = v = torch.zeros(1, 1, 10, 2)
    assert TrimAfterStep.streaming_decode(q, k, v, 4, 8, 10_000.0)[1][8].tolist() == [0, 1, 2, 3, 6, 7, 8]
    assert EvictBeforeStep.streaming_decode(q, k, v, 4, 8, 10_000.0)[1][9].tolist() == [0, 1, 2, 3, 6, 7, 8, 9]


# ---------------------------------------------------------------------------
# A bug in front of each adapter: the laws see it through the class
# ---------------------------------------------------------------------------


def _no_room(cache, past):
    return cache.evict_for_space(past, 0)


BROKEN = {  # (the adapter, the law): the class used with a shipped bug's off-by-one, which the law must catch
    # the protocol's window (the query counted in it) passed as the class's (the query not counted) when trimming after each step:
    # one key too many, as huggingface/transformers#39408 passed flash-attention the window where it wanted the keys left of the query
    ("TrimAfterStep", "streaming.streaming_decode_matches_attention"):
        _adapter("BrokenTrimAfterStep", _decoding(lambda n_sink, cache_size: cache_size - n_sink, after=_trimmed)),
    # the token coming not counted when making room (num_coming = 0): the cache one token over, the oldest window token kept past
    # its time, as rasbt/LLMs-from-scratch#1008 trimmed its sliding-window cache without the tokens coming in
    ("EvictBeforeStep", "streaming.streaming_cache_law"):
        _adapter("BrokenEvictBeforeStep", _decoding(lambda n_sink, cache_size: cache_size - n_sink, before=_no_room)),
}


@pytest.mark.parametrize(("adapter", "name"), BROKEN, ids=[f"{adapter}-{name}" for adapter, name in BROKEN])
def test_the_adapters_let_the_laws_see_a_bug(adapter, name):
    """Each adapter passes the class's answer on: the off-by-one put in front of it fails the law that names it."""
    outcome = run_invariant(REGISTRY[name], _implementation(BROKEN[adapter, name], label=f"broken {adapter}"), settings=CI)
    assert outcome.status == "failed", outcome.reason
