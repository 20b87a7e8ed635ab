"""Broken attention: the mask, scale, axis, head-layout and batch bugs the course warns about.

Each mutant is the reference's attention with one step wrong; the steps it gets right come
from the helpers below, so the line marked BUG is the only difference.
"""

import math

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import softmax


def _split(y, n_heads):
    """(B, T, d) -> (B, H, T, D): head h takes the contiguous features h·D:(h+1)·D."""
    B, T, d = y.shape
    return y.reshape(B, T, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def _merge(heads):
    """(B, H, T, D) -> (B, T, d), the inverse of _split."""
    B, H, T, D = heads.shape
    return heads.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def _project(x, W, b):
    return x @ W if b is None else x @ W + b  # (B, T, d)


def _qkv(x, W_q, W_k, W_v, n_heads, biases, split=_split):
    """q, k, v, each (B, H, T, D)."""
    return tuple(split(_project(x, W, biases.get(f"b_{n}")), n_heads) for n, W in zip("qkv", (W_q, W_k, W_v), strict=True))


def _scores(q, k):
    return q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])  # (B, H, T, T)


def _future(T, k=1):
    return np.triu(np.ones((T, T), dtype=bool), k=k)  # (T, T): True where a query may not look


def _finish(weights, v, W_o, biases):
    """(out (B, T, d), weights): average the values, merge the heads, project."""
    return _project(_merge(weights @ v), W_o, biases.get("b_o")), weights


def _masked_softmax(scores, causal, future):
    return softmax(np.where(future, -np.inf, scores) if causal else scores)


@mutant(
    replaces="attention",
    killed_by="attention.causal_non_leakage",
    also_named_by=("attention.causal_weights_pattern", "attention.weights_are_distributions"),  # "zeroes the weights after the softmax"
    bug="mask applied after the softmax (future weights zeroed, the denominator keeps them)",
)
def mask_after_softmax(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = softmax(_scores(q, k))
    if causal:
        weights = np.where(_future(x.shape[1]), 0.0, weights)  # BUG: after the softmax
    return _finish(weights, v, W_o, biases)


@mutant(replaces="attention", killed_by="attention.causal_weights_pattern", bug="mask off by one: triu with k=0 also hides the diagonal")
def mask_hides_diagonal(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _future(x.shape[1], k=0))  # BUG: k=0
    return _finish(weights, v, W_o, biases)


@mutant(also_named_by=("attention.causal_weights_pattern",),
        replaces="attention", killed_by="attention.causal_non_leakage", bug="mask off by one: triu with k=2 lets each token see the next")
def mask_sees_next_token(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _future(x.shape[1], k=2))  # BUG: k=2
    return _finish(weights, v, W_o, biases)


MAX_LEN = 16


@mutant(
    also_named_by=("attention.causal_weights_pattern",),
    replaces="attention",
    killed_by="attention.causal_non_leakage",
    bug="mask built for a fixed length of 16 and sliced as if earlier tokens were cached (rows from the end)",
)
def mask_sliced_for_cache(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    T = x.shape[1]
    future = _future(MAX_LEN)[MAX_LEN - T :, :T]  # BUG: query rows of the last T positions, key columns of the first T
    weights = _masked_softmax(_scores(q, k), causal, future)
    return _finish(weights, v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.last_position_mask_free",
    bug="mask transposed: tril instead of triu, so each token sees itself and the future",
)
def mask_transposed(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _future(x.shape[1]).T)  # BUG: the past is hidden
    return _finish(weights, v, W_o, biases)


@mutant(replaces="attention", killed_by="attention.permutation_equivariance", bug="the causal flag is ignored: the mask is always applied")
def causal_flag_ignored(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), True, _future(x.shape[1]))  # BUG: True, not causal
    return _finish(weights, v, W_o, biases)


@mutant(replaces="attention", killed_by="attention.agrees_with_reference", bug="no 1/√d_head scale on the scores",
        also_named_by=("attention.multi_head_is_sum_of_heads",))  # its hint: "or the scores are not scaled by 1/√d_h"
def unscaled_scores(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    scores = q @ k.transpose(0, 1, 3, 2)  # BUG: not divided by √D
    weights = _masked_softmax(scores, causal, _future(x.shape[1]))
    return _finish(weights, v, W_o, biases)


@mutant(replaces="attention", killed_by="attention.agrees_with_reference", bug="scores scaled by 1/√d_model instead of 1/√d_head",
        also_named_by=("attention.multi_head_is_sum_of_heads",))
def scaled_by_d_model(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(x.shape[-1])  # BUG: √d, not √D
    weights = _masked_softmax(scores, causal, _future(x.shape[1]))
    return _finish(weights, v, W_o, biases)


@mutant(replaces="attention", killed_by="attention.weights_are_distributions", bug="softmax over the query axis (axis=-2) instead of the key axis")
def softmax_over_queries(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    scores = _scores(q, k)
    if causal:
        scores = np.where(_future(x.shape[1]), -np.inf, scores)
    weights = softmax(scores, axis=-2)  # BUG: normalises each key's column
    return _finish(weights, v, W_o, biases)


def _split_interleaved(y, n_heads):
    B, T, d = y.shape
    return y.reshape(B, T, d // n_heads, n_heads).transpose(0, 3, 1, 2)  # BUG: (B, T, D, H): head h takes features h, h + H, ...


@mutant(
    replaces="attention",
    killed_by="attention.multi_head_is_sum_of_heads",
    bug="heads split with reshape(B, T, D, H) instead of (B, T, H, D): heads interleave features",
)
def interleaved_heads(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases, split=_split_interleaved)
    weights = _masked_softmax(_scores(q, k), causal, _future(x.shape[1]))
    return _finish(weights, v, W_o, biases)


@mutant(replaces="attention", killed_by="attention.zero_output_projection", bug="residual added inside attention (returns x + attention)")
def residual_inside_attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    out, weights = _finish(_masked_softmax(_scores(q, k), causal, _future(x.shape[1])), v, W_o, biases)
    return x + out, weights  # BUG: the block adds the residual, not attention


@mutant(replaces="attention", killed_by="attention.linear_in_values", bug="keys projected with W_v (a copy-paste slip)")
def keys_from_values(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, _, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    k = _split(x @ W_v, n_heads)  # BUG: W_v, not W_k
    weights = _masked_softmax(_scores(q, k), causal, _future(x.shape[1]))
    return _finish(weights, v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.batch_items_independent",
    bug="batch packed into one sequence without a block-diagonal mask: tokens attend across batch items",
)
def batch_packed_into_one_sequence(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    B, T, d = x.shape
    packed = x.reshape(1, B * T, d)  # BUG: no mask between the packed items
    q, k, v = _qkv(packed, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _future(B * T))  # (1, H, B·T, B·T)
    out, _ = _finish(weights, v, W_o, biases)
    blocks = np.stack([weights[0, :, b * T : (b + 1) * T, b * T : (b + 1) * T] for b in range(B)])  # (B, H, T, T)
    return out.reshape(B, T, d), blocks


@mutant(
    replaces="attention",
    killed_by="attention.causal_gradient",
    bug="softmax stabilised with the row max over all keys, taken before the mask (the future sets the shift)",
    backend="torch",
)
def row_max_before_mask(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    import torch

    B, T, d = x.shape
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases, split=lambda y, H: y.reshape(B, T, H, d // H).transpose(1, 2))  # (B, H, T, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    scores = scores - scores.amax(dim=-1, keepdim=True)  # BUG: the max sees the future keys
    if causal:
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1), float("-inf"))
    e = torch.exp(scores)
    weights = e / e.sum(dim=-1, keepdim=True)  # (B, H, T, T)
    out = _project((weights @ v).transpose(1, 2).reshape(B, T, d), W_o, biases.get("b_o"))
    return out, weights


# -- bugs that live past 8 tokens or at large scores (issue 10): each needs the strategies' long sequences or large scores


def _buffered_future(T, block_size):
    """The causal mask of a model built for `block_size` tokens, as nanoGPT registers it once, applied to T tokens.

    Up to block_size it is the right mask; a longer sequence gets the buffer padded with False: nothing
    past the buffer is masked (the code "works" instead of failing on the shape).
    """
    buffer = _future(block_size)  # (block_size, block_size), built for the configured length
    future = np.zeros((T, T), dtype=bool)
    n = min(T, block_size)
    future[:n, :n] = buffer[:n, :n]  # BUG: rows and columns past block_size stay unmasked
    return future


def _tiled_future(T, tile):
    """A tiled kernel's mask: each diagonal tile of `tile` queries × `tile` keys gets its triangle; the tiles right of the
    diagonal, which the kernel should skip, are neither skipped nor masked. Right for T <= tile."""
    future = np.zeros((T, T), dtype=bool)
    for start in range(0, T, tile):
        stop = min(start + tile, T)
        future[start:stop, start:stop] = _future(stop - start)  # BUG: only within the diagonal tile
    return future


@mutant(
    replaces="attention",
    killed_by="attention.causal_non_leakage",
    also_named_by=("attention.causal_weights_pattern",),  # "a buffer for a fixed block size"
    bug="causal mask from a buffer built for a block size of 64 and sliced: right up to 64 tokens, nothing masked past them",
)
def mask_buffer_for_64_tokens(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _buffered_future(x.shape[1], 64))  # BUG: see _buffered_future
    return _finish(weights, v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.causal_weights_pattern",
    also_named_by=("attention.causal_non_leakage",),  # "a kernel masking only within its tiles of 16 to 128"
    bug="a kernel tiled by 16 masks only within its diagonal tiles: the tiles right of the diagonal are seen (T > 16)",
)
def tiles_of_16_masked_on_the_diagonal_only(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _tiled_future(x.shape[1], 16))  # BUG: see _tiled_future
    return _finish(weights, v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.causal_non_leakage",
    also_named_by=("attention.causal_weights_pattern",),  # "a mask built per tile of 16 to 128 that leaves the tiles beyond ..."
    bug="a kernel tiled by 128 masks only within its diagonal tiles: right up to 128 tokens, the 129th is seen by the first 128",
)
def tiles_of_128_masked_on_the_diagonal_only(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _tiled_future(x.shape[1], 128))  # BUG: see _tiled_future
    return _finish(weights, v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.causal_non_leakage",
    also_named_by=("attention.causal_weights_pattern",),  # its hint names the finite fill of -1e4 too
    bug="an additive mask of -1e4 (GPT-2's masked_bias) instead of -inf: the future leaks once scores differ by about 1e4",
)
def additive_mask_of_minus_1e4(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    scores = _scores(q, k)
    if causal:
        scores = scores + np.where(_future(x.shape[1]), -1e4, 0.0)  # BUG: exp(s - 1e4 - max) is not 0 for s near 1e4
    return _finish(softmax(scores), v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.causal_weights_pattern",
    also_named_by=("attention.causal_non_leakage",),  # "a finite value instead of -inf (an additive mask of -1e4 ...)"
    bug="the future filled with -1e4 (HF GPT-2's masked_bias, torch.where(mask, w, -1e4)) instead of -inf: weights above the "
    "diagonal once a query's visible scores are near -1e4",
)
def future_filled_with_minus_1e4(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    scores = _scores(q, k)
    if causal:
        scores = np.where(_future(x.shape[1]), -1e4, scores)  # BUG: -1e4 is not -inf
    return _finish(softmax(scores), v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.large_scores_stay_finite",
    bug="attention's softmax without the max subtracted: exp(score) overflows past 709 (88 in float32), inf/inf = NaN",
)
def softmax_without_max_in_attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    scores = _scores(q, k)
    if causal:
        scores = np.where(_future(x.shape[1]), -np.inf, scores)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(scores)  # BUG: no scores - scores.max(-1)
        weights = e / e.sum(axis=-1, keepdims=True)
    return _finish(weights, v, W_o, biases)


@mutant(
    replaces="attention",
    killed_by="attention.causal_gradient",
    bug="causal mask from a buffer built for 32 tokens and sliced (torch): nothing masked past 32, so ∂out_i/∂x_j != 0 for j > i >= 32",
    backend="torch",
)
def mask_buffer_for_32_tokens_torch(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    import torch

    B, T, d = x.shape
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases, split=lambda y, H: y.reshape(B, T, H, d // H).transpose(1, 2))  # (B, H, T, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if causal:
        future = torch.as_tensor(_buffered_future(T, 32), device=x.device)  # BUG: see _buffered_future
        scores = scores.masked_fill(future, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = _project((weights @ v).transpose(1, 2).reshape(B, T, d), W_o, biases.get("b_o"))
    return out, weights


@mutant(
    replaces="attention",
    killed_by="attention.agrees_with_reference",
    bug="scores and softmax computed in float16 inside (q.half() @ k.half().T, as under autocast): a float32 run keeps 3 digits",
    backend="torch",
    dtype="float32",
)
def scores_in_float16_torch(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    import torch

    B, T, d = x.shape
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases, split=lambda y, H: y.reshape(B, T, H, d // H).transpose(1, 2))  # (B, H, T, D)
    scores = (q.half() @ k.half().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # BUG: float16 internals
    if causal:
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1), float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(x.dtype)  # back to the input dtype: the dtype law cannot see it
    out = _project((weights @ v).transpose(1, 2).reshape(B, T, d), W_o, biases.get("b_o"))
    return out, weights
