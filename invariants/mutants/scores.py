"""Broken attention scores as shipped: ALiBi, softcapping and attention sinks, each a bug that reached a release (cited)."""

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import masked_softmax, scores_and_visible, softcap


@mutant(
    replaces="alibi_slopes",
    killed_by="scores.alibi_slopes_other_counts",
    bug="one geometric sequence 2^(-8i/H) for every head count, right only for powers of two (ml-explore/mlx#3071, mlx#343)",
)
def geometric_alibi_slopes(n_heads):
    return 2.0 ** (-8.0 * np.arange(1, n_heads + 1) / n_heads)


@mutant(
    replaces="alibi_slopes",
    killed_by="scores.alibi_slopes_powers_of_two",
    also_named_by=("scores.alibi_slopes_other_counts",),
    bug="the slopes' exponent off by one, 2^(-8h/H) from h = 0, so head 0 gets slope 1 (paiml/aprender#2143)",
)
def off_by_one_alibi_slopes(n_heads):
    return 2.0 ** (-8.0 * np.arange(n_heads) / n_heads)


def _alibi(q, k, v, slopes, key_mask, distance):
    scores, visible, v = scores_and_visible(q, k, v, True, key_mask, None)
    weights = masked_softmax(scores - np.asarray(slopes)[:, None, None] * distance, visible)
    return weights @ v, weights


@mutant(
    replaces="alibi_attention",
    killed_by="scores.alibi_attention_queries_shorter_than_keys",
    also_named_by=("scores.alibi_attention_agrees_with_reference",),
    bug="the ALiBi bias built over the queries, not the keys: a KV-cache step gets no bias at all (keras-team/keras-hub#2861)",
)
def query_length_alibi_attention(q, k, v, slopes, key_mask, *, fully_masked="zeros"):
    T, S = q.shape[2], k.shape[2]
    distance = np.arange(T)[:, None] - np.arange(S)[None, :] if T == S else np.zeros((T, S))  # BUG: no bias with a cache
    return _alibi(q, k, v, slopes, key_mask, distance)


@mutant(
    replaces="alibi_attention",
    killed_by="scores.alibi_attention_decays_with_distance",
    also_named_by=("scores.alibi_attention_agrees_with_reference",),
    bug="the ALiBi bias's sign flipped, slope·(i - j), so far keys are favoured (meta-pytorch/attention-gym#86)",
)
def flipped_alibi_attention(q, k, v, slopes, key_mask, *, fully_masked="zeros"):
    T, S = q.shape[2], k.shape[2]
    return _alibi(q, k, v, slopes, key_mask, np.arange(S)[None, :] - np.arange(S - T, S)[:, None])  # BUG: the sign


@mutant(
    replaces="softcapped_attention",
    killed_by="scores.softcapped_attention_masked_keys_get_zero",
    also_named_by=("scores.softcapped_attention_agrees_with_reference",),
    bug="the mask applied before the softcap, turning -inf into -cap: masked keys leak (onnx/onnx#7865, emmtrix/emx-onnx-cgen#731)",
)
def mask_then_cap_softcapped_attention(q, k, v, causal, key_mask, window, cap, *, fully_masked="zeros"):
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    capped = softcap(np.where(visible, scores, -np.inf), cap)  # BUG: -inf becomes -cap
    weights = masked_softmax(capped, np.broadcast_to(visible.any(axis=-1, keepdims=True), capped.shape), fully_masked=fully_masked)
    return weights @ v, weights


@mutant(
    replaces="softcapped_attention",
    killed_by="scores.softcapped_attention_weights_bounded",
    also_named_by=("scores.softcapped_attention_agrees_with_reference",),
    bug="the softcap passed to the attention kernel but never applied (sgl-project/sgl-kernel-xpu#491)",
)
def uncapped_softcapped_attention(q, k, v, causal, key_mask, window, cap, *, fully_masked="zeros"):
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    weights = masked_softmax(scores, visible, fully_masked=fully_masked)  # BUG: no cap
    return weights @ v, weights


@mutant(
    replaces="softcap",
    killed_by="scores.softcap_bounded",
    also_named_by=("scores.softcap_agrees_with_reference",),
    bug="tanh written as (e^2y - 1)/(e^2y + 1), inf/inf = NaN for large logits (vllm#56578)",
)
def exp_tanh_softcap(x, cap):
    e = np.exp(2 * x / cap)
    return cap * (e - 1) / (e + 1)  # BUG: NaN once e^(2x/cap) overflows


@mutant(
    replaces="sink_attention",
    killed_by="scores.sink_attention_weights_sum_below_one",
    also_named_by=("scores.sink_attention_agrees_with_reference", "scores.sink_attention_large_logits"),
    bug="the sinks accepted and dropped: a plain softmax over the keys (vllm#52156, vllm-project/vllm-metal#550)",
)
def dropped_sink_attention(q, k, v, causal, key_mask, window, sinks):
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    weights = masked_softmax(scores, visible)  # BUG: no sink
    return weights @ v, weights


@mutant(
    replaces="sink_attention",
    killed_by="scores.sink_attention_large_logits",
    bug="the sink's and the scores' exponentials taken without a max: e^score overflows, inf/inf (NVIDIA/TensorRT-LLM#19220)",
)
def unshifted_sink_attention(q, k, v, causal, key_mask, window, sinks):
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    keys = np.where(visible, np.exp(scores), 0.0)  # BUG: no max subtracted
    weights = keys / (keys.sum(axis=-1, keepdims=True) + np.exp(np.asarray(sinks))[:, None, None])
    return weights @ v, weights
