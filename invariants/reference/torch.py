"""Reference transformer in torch: the same functions as reference.numpy, on any device and dtype.

Line for line the maths of reference.numpy (read that file for the lesson); torch is used as a
tensor library only: no nn.MultiheadAttention, no F.scaled_dot_product_attention, no
torch.topk (whose tie-breaking is undocumented: all-equal scores over 4 experts pick
[2, 3, 0] on CPU). Each function runs on the device and in the dtype of its inputs.

Dimension letters: B batch, T sequence, d model width, H heads, D head width (d = H·D),
F feed-forward width, V vocabulary, N tokens, E experts.
"""

from __future__ import annotations

import math

import torch

from invariants.reference.counts import (  # noqa: F401  (part of this module's protocol surface)
    gpt_param_count,
    inference_flops_per_token,
    moe_active_params,
    moe_n_params,
    training_flops,
)
from invariants.reference.numpy import (
    ATTENTION_BIAS_NAMES,
    EPS,
    FULLY_MASKED,
    GELU_FORMS,
    ROPE_BASE,
    ROPE_PAIRINGS,
    ROPE_TYPES,
    check_token_ids,
    check_vocab_ids,
    rotary_width,
    yarn_correction_range,
    yarn_mscale,
)
from invariants.reference.surface import surface
from invariants.reference.text import build_vocab, decode, encode, get_batch  # noqa: F401

__getattr__ = surface(__name__)  # __all__: every protocol function and constant the module holds (invariants.reference.surface)

BACKEND = "torch"
PROTOCOL_VERSION = 2
GELU_FORM = "tanh"  # declared conventions, as in reference.numpy
ATTENTION_BIASES = True
LOW_PRECISION = (torch.float16, torch.bfloat16)


def accumulate_in_float32(fn):
    """Run fn in float32 on 16-bit inputs and round the answer back, as torch's own norm and softmax kernels do."""

    def wrapper(x, *args, **kwargs):
        if x.dtype not in LOW_PRECISION:
            return fn(x, *args, **kwargs)
        up = [a.float() if isinstance(a, torch.Tensor) and a.dtype in LOW_PRECISION else a for a in args]
        return fn(x.float(), *up, **kwargs).to(x.dtype)

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _row_max(x, axis):
    """The maximum along `axis`, as a constant for autograd: softmax(x - m) is the same for every m, so its gradient through m is 0."""
    return x.amax(dim=axis, keepdim=True).detach()  # spares the backward pass a gradient it would round to about 0


@accumulate_in_float32
def softmax(x, axis=-1):
    """exp(x) / Σ exp(x) along `axis`, the row maximum subtracted first."""
    shifted = x - _row_max(x, axis)
    e = torch.exp(shifted)
    return e / e.sum(dim=axis, keepdim=True)


@accumulate_in_float32
def log_softmax(x, axis=-1):
    """x - logsumexp(x) along `axis`."""
    shifted = x - _row_max(x, axis)
    return shifted - torch.log(torch.exp(shifted).sum(dim=axis, keepdim=True))


def cross_entropy(logits, targets):
    """Mean negative log-probability of the targets, in nats: (..., V), (...) -> scalar."""
    log_probs = log_softmax(logits)  # (..., V)
    picked = torch.gather(log_probs, -1, targets[..., None])  # (..., 1)
    return -picked.mean()


@accumulate_in_float32
def layer_norm(x, gain, bias, eps=EPS):
    """Per-row mean 0, population variance 1 (eps inside the square root), then gain and bias."""
    mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
    centred = x - mean  # (..., d)
    var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1)
    return centred / torch.sqrt(var + eps) * gain + bias


@accumulate_in_float32
def rms_norm(x, gain, eps=EPS):
    """Divide each row by its root mean square, then scale."""
    mean_square = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)
    return x / torch.sqrt(mean_square + eps) * gain


def gelu(x):
    """GELU, tanh approximation (GPT-2's)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gelu_erf(x):
    """GELU, exact form 0.5·x·(1 + erf(x/√2)) (nn.GELU()'s)."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_of(form):
    """The GELU of `form`: "tanh" (gelu) or "erf" (gelu_erf)."""
    if form not in GELU_FORMS:
        raise ValueError(f"gelu_form={form!r} is not one of {', '.join(GELU_FORMS)}")
    return gelu if form == "tanh" else gelu_erf


def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    """Multi-head self-attention: (B, T, d) -> (B, T, d) and weights (B, H, T, T)."""
    B, T, d = x.shape
    D = d // n_heads

    def split_heads(W, b):
        y = x @ W if b is None else x @ W + b  # (B, T, d)
        return y.reshape(B, T, n_heads, D).transpose(1, 2)  # (B, H, T, D)

    q, k, v = split_heads(W_q, b_q), split_heads(W_k, b_k), split_heads(W_v, b_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
    if causal:
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)  # (T, T)
        scores = scores.masked_fill(future, float("-inf"))  # mask BEFORE the softmax
    weights = softmax(scores)  # (B, H, T, T)
    heads = weights @ v  # (B, H, T, D)
    merged = heads.transpose(1, 2).reshape(B, T, d)  # (B, T, H, D) -> (B, T, d)
    out = merged @ W_o if b_o is None else merged @ W_o + b_o  # (B, T, d)
    return out, weights


def feed_forward(x, W1, b1, W2, b2, *, gelu_form="tanh"):
    """Position-wise d -> F -> d with a GELU between: (..., d) -> (..., d)."""
    return gelu_of(gelu_form)(x @ W1 + b1) @ W2 + b2


def transformer_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    """Pre-norm block: x + Attn(LN(x)), then + FFN(LN(x)). (B, T, d) -> (B, T, d)."""
    p = params
    biases = {name: p[name] for name in ATTENTION_BIAS_NAMES if name in p}
    normed = layer_norm(x, p["ln1_g"], p["ln1_b"], eps)
    attn_out, _ = attention(normed, p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal, **biases)
    x = x + attn_out
    x = x + feed_forward(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)
    return x


def gpt_logits(ids, params, n_heads, *, gelu_form="tanh", eps=EPS):
    """(B, T) token ids -> (B, T, V) logits; positions are learned, the output is the tied token table."""
    wte, wpe = params["wte"], params["wpe"]
    check_token_ids(ids, vocab=wte.shape[0], max_len=wpe.shape[0])
    T = ids.shape[1]
    x = wte[ids] + wpe[:T]  # (B, T, d)
    for block in params["blocks"]:
        x = transformer_block(x, block, n_heads, causal=True, gelu_form=gelu_form, eps=eps)
    h = layer_norm(x, params["lnf_g"], params["lnf_b"], eps)  # (B, T, d)
    return h @ wte.T  # (B, T, V)


def top_k_indices(router_logits, k):
    """The k best experts per token, ties to the lower index: (N, E) -> (N, k). A stable descending sort, not topk."""
    return torch.sort(router_logits, dim=-1, descending=True, stable=True).indices[..., :k]


def top_k_gates(router_logits, k):
    """(N, E) -> (N, E) gates: a softmax over each token's k kept scores, 0 elsewhere."""
    top = top_k_indices(router_logits, k)  # (N, k)
    kept = torch.gather(router_logits, -1, top)  # (N, k)
    return torch.zeros_like(router_logits).scatter(-1, top, softmax(kept))


def expert(x, params, *, gelu_form="tanh"):
    """One expert of moe on x (..., d) -> (..., d): the GELU feed-forward network {W1, b1, W2, b2}, or the SwiGLU one {W_gate, W_up, W_down}."""
    return swiglu(x, **params) if "W_gate" in params else feed_forward(x, **params, gelu_form=gelu_form)


def moe(x, router, experts, k, *, gelu_form="tanh"):
    """Sparse mixture of experts: (N, d) -> (N, d), each token mixing its top-k experts' outputs."""
    gates = top_k_gates(x @ router, k)  # (N, E)
    out = torch.zeros_like(x)
    for e, params in enumerate(experts):
        chosen = gates[:, e] > 0  # (N,)
        if chosen.any():
            out[chosen] += gates[chosen, e : e + 1] * expert(x[chosen], params, gelu_form=gelu_form)
    return out


def tokens_per_expert(router_logits, k):
    """Tokens routed to each expert: (N, E) -> (E,), summing to N·k."""
    return torch.bincount(top_k_indices(router_logits, k).reshape(-1), minlength=router_logits.shape[-1])


def load_balancing_loss(router_logits, k):
    """Switch auxiliary loss E · Σ_i f_i · P_i (f from hard top-k counts over N·k slots, P the mean probability)."""
    N, E = router_logits.shape
    f = tokens_per_expert(router_logits, k).to(router_logits.dtype) / (N * k)  # (E,)
    P = softmax(router_logits).mean(dim=0)  # (E,)
    return E * torch.sum(f * P)


# ---------------------------------------------------------------------------
# The modern decoder (protocol v2): the twin of the same section of reference.numpy (read it there).
# ---------------------------------------------------------------------------

ROPE_PAIRING = "half_split"  # declared conventions, as in reference.numpy
QKV_BIASES = True
FULLY_MASKED_ROWS = "zeros"


def rope_angles(positions, D, base=ROPE_BASE):
    """(T,) positions -> (T, D/2) angles p·θ_i, θ_i = base^(-2i/D), in float64 on the positions' device."""
    positions = torch.as_tensor(positions)
    inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float64, device=positions.device) / D)  # (D/2,)
    return positions.to(torch.float64)[:, None] * inv_freq  # (T, D/2)


def rope_pairs(x, pairing):
    """The two coordinates of every rotated pair: (first, second), each (..., D/2)."""
    if pairing not in ROPE_PAIRINGS:
        raise ValueError(f"pairing={pairing!r} is not one of {', '.join(ROPE_PAIRINGS)}")
    if pairing == "half_split":
        half = x.shape[-1] // 2
        return x[..., :half], x[..., half:]  # pair i is (i, i + D/2)
    return x[..., 0::2], x[..., 1::2]  # pair i is (2i, 2i + 1)


def rope_join(first, second, pairing):
    """The inverse of rope_pairs: (..., D/2) twice -> (..., D)."""
    if pairing == "half_split":
        return torch.cat([first, second], dim=-1)
    return torch.stack([first, second], dim=-1).reshape(*first.shape[:-1], -1)  # (..., D/2, 2) -> (..., D)


def rope(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    """Rotary position embedding: pair i of the vector at position p rotated by p·θ_i. (..., T, D) -> (..., T, D)."""
    angles = rope_angles(torch.as_tensor(positions, device=x.device), x.shape[-1], base)  # (T, D/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)  # (T, D/2)
    first, second = rope_pairs(x, pairing)  # (..., T, D/2) each
    return rope_join(first * cos - second * sin, first * sin + second * cos, pairing)


def visible_keys(T, S, causal=True, window=None, device=None):
    """(T, S) True where query i (at position S - T + i: bottom-right aligned) may see key j."""
    query_position = torch.arange(S - T, S, device=device)[:, None]  # (T, 1)
    key_position = torch.arange(S, device=device)[None, :]  # (1, S)
    visible = torch.ones(T, S, dtype=torch.bool, device=device)
    if causal:
        visible &= key_position <= query_position
        if window is not None:
            visible &= key_position > query_position - window
    return visible


def masked_softmax(scores, visible, *, fully_masked="zeros"):
    """softmax over each row's visible entries (a boolean select, never an additive mask); a row with none gets `fully_masked`."""
    if fully_masked not in FULLY_MASKED:
        raise ValueError(f"fully_masked={fully_masked!r} is not one of {', '.join(FULLY_MASKED)}")
    any_visible = visible.any(dim=-1, keepdim=True)  # (..., 1)
    scores = scores.masked_fill(~visible, float("-inf"))  # mask BEFORE the softmax
    scores = scores.masked_fill(~any_visible, 0.0)  # a row with no visible key: all 0, so its softmax is 1/S, finite
    weights = softmax(scores)
    return weights if fully_masked == "uniform" else weights.masked_fill(~any_visible, 0.0)


def repeat_kv(k, group):
    """(B, H_kv, S, D) -> (B, H_kv·group, S, D) in repeat-interleave order [kv0, kv0, kv1, kv1]."""
    return k.repeat_interleave(group, dim=1)


def gqa_attention(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
    """Grouped-query attention core: q (B, H, T, D), k and v (B, H_kv, S, D) -> out (B, H, T, D), weights (B, H, T, S)."""
    B, H, T, D = q.shape
    S = k.shape[2]
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])  # (B, H, S, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, S)
    visible = visible_keys(T, S, causal, window, q.device)  # (T, S)
    if key_mask is not None:
        visible = visible & key_mask.to(torch.bool)[:, None, None, :]  # (B, 1, T, S)
    weights = masked_softmax(scores, visible.expand(scores.shape), fully_masked=fully_masked)  # (B, H, T, S)
    return weights @ v, weights  # (B, H, T, D)


def sigmoid(x):
    """1 / (1 + exp(-x)) without overflow: exp of -|x| only."""
    e = torch.exp(-x.abs())
    return torch.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x):
    """SiLU (swish): x·σ(x)."""
    return x * sigmoid(x)


def swiglu(x, W_gate, W_up, W_down):
    """SwiGLU feed-forward: (SiLU(x·W_gate) ⊙ x·W_up)·W_down. (..., d) -> (..., d)."""
    return (silu(x @ W_gate) * (x @ W_up)) @ W_down


def split_heads(y, n_heads):
    """(B, T, H·D) -> (B, H, T, D)."""
    B, T, width = y.shape
    return y.reshape(B, T, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(y):
    """(B, H, T, D) -> (B, T, H·D)."""
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)


def project(x, W, b=None):
    """x·W (+ b)."""
    return x @ W if b is None else x @ W + b


def chunk_positions(past_length, n):
    """The positions of n new tokens after past_length cached ones: past_length .. past_length + n - 1."""
    return torch.arange(past_length, past_length + n)


def llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    """Llama's attention sublayer on new tokens x (B, T, d) at `positions` after a cache of (k, v, positions): (out (B, T, d), extended cache)."""
    q = split_heads(project(x, p["W_q"], p.get("b_q")), n_heads)  # (B, H, T, D)
    k = split_heads(project(x, p["W_k"], p.get("b_k")), n_kv_heads)  # (B, H_kv, T, D)
    v = split_heads(project(x, p["W_v"], p.get("b_v")), n_kv_heads)  # (B, H_kv, T, D)
    q, k = rope(q, positions, rope_base, pairing=pairing), rope(k, positions, rope_base, pairing=pairing)
    held = torch.as_tensor(positions)  # (T,): the positions of the keys in the cache
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # (B, H_kv, S_past + T, D)
        held = torch.cat([cache[2], held])  # (S_past + T,)
    heads, _ = gqa_attention(q, k, v, True, None, window)  # (B, H, T, D)
    return merge_heads(heads) @ p["W_o"], (k, v, held)  # (B, T, d)


def llama_block_step(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=EPS):
    """One Llama block on new tokens x (B, T, d) at `positions`: (out (B, T, d), the extended cache)."""
    p = params
    attended, cache = llama_attention(rms_norm(x, p["attn_norm"], eps), p, n_heads, n_kv_heads, positions, rope_base, window, cache,
                                      pairing=pairing)
    h = x + attended
    return h + swiglu(rms_norm(h, p["ffn_norm"], eps), p["W_gate"], p["W_up"], p["W_down"]), cache


def llama_block(x, params, n_heads, n_kv_heads, rope_base=ROPE_BASE, window=None, *, pairing="half_split", eps=EPS):
    """Llama's pre-norm decoder block on a whole sequence, causal, positions 0 .. T - 1. (B, T, d) -> (B, T, d)."""
    out, _ = llama_block_step(x, params, n_heads, n_kv_heads, rope_base, window, chunk_positions(0, x.shape[1]),
                              pairing=pairing, eps=eps)
    return out


def llama_logits(ids, params, n_heads, n_kv_heads, rope_base=ROPE_BASE, window=None, *, pairing="half_split", eps=EPS):
    """(B, T) ids -> (B, T, V) logits: embed, the blocks, the final RMSNorm, an untied head W_out."""
    logits, _ = llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, [ids.shape[1]], pairing=pairing, eps=eps)
    return logits


def cache_positions(caches, n_kv_heads):
    """(n, L, H_c, S) from each chunk's cache: the position of the key in each slot of each layer and stored head, -1 where empty."""
    heads = caches[0][0][0].shape[1] if caches and caches[0] else n_kv_heads
    slots = max((len(held) for cache in caches for _, _, held in cache), default=0)
    table = torch.full((len(caches), len(caches[0]) if caches else 0, heads, slots), -1, dtype=torch.int64)
    for i, cache in enumerate(caches):
        for layer, (_, _, held) in enumerate(cache):
            table[i, layer, :, : len(held)] = held  # every head of a layer holds the same positions
    return table


def llama_decode(ids, params, n_heads, n_kv_heads, rope_base=ROPE_BASE, window=None, chunks=None, *, pairing="half_split", eps=EPS):
    """A prefill of chunks[0] tokens, then each further chunk on the cache: (logits (B, T, V), cache_positions (n, L, H_kv, S))."""
    return decode_layers(ids, params, n_heads, n_kv_heads, [(window, rope_base)] * len(params["blocks"]), chunks, pairing=pairing,
                         eps=eps)


def decode_layers(ids, params, n_heads, n_kv_heads, layers, chunks=None, *, pairing="half_split", eps=EPS):
    """llama_decode with each layer's own attention: layers [(window or None, rope_base)], one per block (Gemma 2 and 3, gpt-oss,
    Qwen2's max_window_layers: hybrid_decode). -> (logits (B, T, V), cache_positions (n, L, H_kv, S))."""
    check_vocab_ids(ids, params["embed"].shape[0])
    T = ids.shape[1]
    chunks = [T] if chunks is None else [int(n) for n in torch.as_tensor(chunks).reshape(-1)]
    if any(n < 1 for n in chunks) or sum(chunks) != T:
        raise ValueError(f"chunks {chunks} must be positive and sum to the sequence length {T}")
    cache = [None] * len(params["blocks"])  # per layer: (k, v, positions), k and v (B, H_kv, t, D), positions (t,)
    logits, caches, start = [], [], 0
    for n in chunks:
        x = params["embed"][ids[:, start : start + n]]  # (B, n, d)
        positions = chunk_positions(start, n)  # past_length + i, not i
        for layer, (block, (window, rope_base)) in enumerate(zip(params["blocks"], layers, strict=True)):
            x, cache[layer] = llama_block_step(x, block, n_heads, n_kv_heads, rope_base, window, positions, cache[layer],
                                               pairing=pairing, eps=eps)
        logits.append(rms_norm(x, params["norm"], eps) @ params["W_out"])  # (B, n, V)
        caches.append(list(cache))  # as it stands after this chunk
        start += n
    return torch.cat(logits, dim=1), cache_positions(caches, n_kv_heads)


def cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads):
    """Queries from x (B, T, d), keys and values from memory (B, S, d), no mask: out (B, T, d), weights (B, H, T, S)."""
    q = split_heads(x @ W_q, n_heads)  # (B, H, T, D)
    k, v = split_heads(memory @ W_k, n_heads), split_heads(memory @ W_v, n_heads)  # (B, H, S, D)
    heads, weights = gqa_attention(q, k, v, False, None, None)
    return merge_heads(heads) @ W_o, weights  # (B, T, d)


def decoder_block(x, memory, params, n_heads, *, gelu_form="tanh", eps=EPS):
    """The encoder-decoder decoder block, pre-norm: causal self-attention, cross-attention, feed-forward. (B, T, d) -> (B, T, d)."""
    p = params
    x = x + attention(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, True)[0]
    x = x + cross_attention(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), memory, p["Wc_q"], p["Wc_k"], p["Wc_v"], p["Wc_o"], n_heads)[0]
    return x + feed_forward(layer_norm(x, p["ln3_g"], p["ln3_b"], eps), p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)


def qk_norm_attention(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    """Causal GQA with each head's q and k RMS-normalised over D (gains q_norm, k_norm (D,)) before RoPE: out (B, T, d), weights (B, H, T, T)."""
    p = params
    q = rms_norm(split_heads(x @ p["W_q"], n_heads), p["q_norm"], eps)  # (B, H, T, D)
    k = rms_norm(split_heads(x @ p["W_k"], n_kv_heads), p["k_norm"], eps)  # (B, H_kv, T, D)
    v = split_heads(x @ p["W_v"], n_kv_heads)  # (B, H_kv, T, D): not normalised
    q, k = rope(q, positions, rope_base, pairing=pairing), rope(k, positions, rope_base, pairing=pairing)
    heads, weights = gqa_attention(q, k, v, True, None, None)  # (B, H, T, D), (B, H, T, T)
    return merge_heads(heads) @ p["W_o"], weights  # (B, T, d)


# ---------------------------------------------------------------------------
# MoE routing as shipped (protocol v2): the twin of the same section of reference.numpy (read it there for the sources).
# ---------------------------------------------------------------------------


def group_scores(choice_scores, n_group):
    """(N, E) -> (N, G): each group of E/G consecutive experts scored by the sum of its two largest choice scores."""
    N, E = choice_scores.shape
    grouped = choice_scores.reshape(N, n_group, E // n_group)  # (N, G, E/G)
    return torch.sort(grouped, dim=-1, descending=True).values[..., :2].sum(dim=-1)


def grouped_top_k_indices(router_logits, bias, k, n_group, topk_group):
    """The k experts DeepSeek-V3 routes each token to, (N, k), best first, ties to the lower index (a stable sort, not topk)."""
    N, E = router_logits.shape
    choice = sigmoid(router_logits) + bias  # (N, E): the bias steers the choice, never the gates
    kept = torch.zeros(N, n_group, dtype=torch.bool, device=router_logits.device)
    kept = kept.scatter(-1, top_k_indices(group_scores(choice, n_group), topk_group), True)  # (N, G)
    in_kept_group = kept.repeat_interleave(E // n_group, dim=-1)  # (N, E)
    return top_k_indices(choice.masked_fill(~in_kept_group, float("-inf")), k)


def grouped_top_k_gates(router_logits, bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    """DeepSeek-V3's router: (N, E) logits, (E,) bias -> (N, E) gates: the chosen affinities σ(r) (no bias), normalised where
    norm_topk_prob, times routed_scaling_factor; 0 for the experts not chosen."""
    top = grouped_top_k_indices(router_logits, bias, k, n_group, topk_group)  # (N, k)
    weights = torch.gather(sigmoid(router_logits), -1, top)  # (N, k)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.zeros_like(router_logits).scatter(-1, top, weights * routed_scaling_factor)


def softmax_top_k_gates(router_logits, k, norm_topk_prob):
    """Qwen3-MoE's router: softmax over all E experts, the k largest kept, renormalised where norm_topk_prob. (N, E) -> (N, E)."""
    top = top_k_indices(router_logits, k)  # (N, k)
    probs = torch.gather(softmax(router_logits), -1, top)  # (N, k)
    if norm_topk_prob:
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(router_logits).scatter(-1, top, probs)


def expert_bias_update(bias, tokens_per_expert, rate):
    """The auxiliary-loss-free bias update: down by `rate` above the mean load, up below it, unchanged at it. (E,) -> (E,)."""
    counts = torch.as_tensor(tokens_per_expert, device=bias.device).to(torch.int64)  # (E,)
    direction = torch.sign(counts.sum() - counts * counts.numel())  # sign(mean - load), exactly in integers
    return bias + direction.to(bias.dtype) * rate


# ---------------------------------------------------------------------------
# Multi-head latent attention (protocol v2): the twin of the same section of reference.numpy (read it there for the sources).
# ---------------------------------------------------------------------------


def mla_widths(params, n_heads):
    """(D_n, D_r, D_v): the head widths MLA's params hold."""
    return params["W_uk"].shape[1] // n_heads, params["W_kr"].shape[1], params["W_uv"].shape[1] // n_heads


def mla_softmax_scale(qk_nope_head_dim, qk_rope_head_dim, mscale):
    """mscale²/√(D_n + D_r): the scale of a score over the whole query head, times YaRN's attention factor squared."""
    return mscale * mscale / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)


def mla_query(x, p, n_heads, positions, rope_base, *, pairing="half_split", eps=EPS):
    """The queries (B, H, T, D_n + D_r): each head's position-free features, then its D_r features rotated at `positions`."""
    q = x @ p["W_q"] if "W_q" in p else rms_norm(x @ p["W_dq"], p["q_norm"], eps) @ p["W_uq"]  # (B, T, H·(D_n + D_r))
    q = split_heads(q, n_heads)  # (B, H, T, D_n + D_r)
    D_r = p["W_kr"].shape[1]
    return torch.cat([q[..., :-D_r], rope(q[..., -D_r:], positions, rope_base, pairing=pairing)], dim=-1)


def mla_latent(x, p, positions, rope_base, *, pairing="half_split", eps=EPS):
    """What MLA caches for each token, (B, T, r_kv + D_r): RMSNorm(x·W_dkv), then the RoPE key shared by every head."""
    latent = rms_norm(x @ p["W_dkv"], p["kv_norm"], eps)  # (B, T, r_kv)
    return torch.cat([latent, rope(x @ p["W_kr"], positions, rope_base, pairing=pairing)], dim=-1)


def mla_attention(x, params, n_heads, positions, rope_base=ROPE_BASE, mscale=1.0, *, pairing="half_split", eps=EPS):
    """Causal multi-head latent attention, keys and values up-projected per head: out (B, T, d), weights (B, H, T, T)."""
    p = params
    D_n, D_r, _ = mla_widths(p, n_heads)
    q = mla_query(x, p, n_heads, positions, rope_base, pairing=pairing, eps=eps)  # (B, H, T, D_n + D_r)
    cache = mla_latent(x, p, positions, rope_base, pairing=pairing, eps=eps)  # (B, T, r_kv + D_r)
    latent, k_rope = cache[..., :-D_r], cache[..., -D_r:]
    k_nope = split_heads(latent @ p["W_uk"], n_heads)  # (B, H, T, D_n)
    k = torch.cat([k_nope, k_rope[:, None].expand(*k_nope.shape[:-1], D_r)], dim=-1)  # (B, H, T, D_n + D_r)
    v = split_heads(latent @ p["W_uv"], n_heads)  # (B, H, T, D_v)
    T = x.shape[1]
    scores = q @ k.transpose(-2, -1) * mla_softmax_scale(D_n, D_r, mscale)  # (B, H, T, T)
    weights = masked_softmax(scores, visible_keys(T, T, device=x.device).expand(scores.shape))
    return merge_heads(weights @ v) @ p["W_o"], weights  # (B, T, d)


def mla_absorbed(q, cache, p, n_heads, mscale):
    """Attention of the last T of S cached tokens with W_uk folded into the queries and W_uv after the weights: (B, H, T, D_v)."""
    D_n, D_r, D_v = mla_widths(p, n_heads)
    r_kv = p["W_uk"].shape[0]
    W_uk, W_uv = p["W_uk"].reshape(r_kv, n_heads, D_n), p["W_uv"].reshape(r_kv, n_heads, D_v)
    latent, k_rope = cache[:, None, :, :-D_r], cache[:, None, :, -D_r:]  # (B, 1, S, r_kv), (B, 1, S, D_r)
    q_latent = torch.einsum("bhtn,rhn->bhtr", q[..., :D_n], W_uk)  # (B, H, T, r_kv)
    scores = (q_latent @ latent.transpose(-2, -1) + q[..., D_n:] @ k_rope.transpose(-2, -1)) * mla_softmax_scale(D_n, D_r, mscale)
    T, S = q.shape[2], cache.shape[1]
    weights = masked_softmax(scores, visible_keys(T, S, device=q.device).expand(scores.shape))  # (B, H, T, S)
    return torch.einsum("bhtr,rhv->bhtv", weights @ latent, W_uv)  # (B, H, T, D_v)


def mla_decode(x, params, n_heads, positions, rope_base=ROPE_BASE, mscale=1.0, chunks=None, *, pairing="half_split", eps=EPS):
    """MLA over x (B, T, d) in chunks on its latent cache, absorbed: (out (B, T, d), the cache (B, T, r_kv + D_r))."""
    T = x.shape[1]
    chunks = [T] if chunks is None else [int(n) for n in torch.as_tensor(chunks).reshape(-1)]
    if any(n < 1 for n in chunks) or sum(chunks) != T:
        raise ValueError(f"chunks {chunks} must be positive and sum to the sequence length {T}")
    positions = torch.as_tensor(positions)
    outs, cached, start = [], [], 0
    for n in chunks:
        new, at = x[:, start : start + n], positions[start : start + n]
        cached.append(mla_latent(new, params, at, rope_base, pairing=pairing, eps=eps))  # appended, never recomputed
        cache = torch.cat(cached, dim=1)  # (B, start + n, r_kv + D_r)
        q = mla_query(new, params, n_heads, at, rope_base, pairing=pairing, eps=eps)
        outs.append(merge_heads(mla_absorbed(q, cache, params, n_heads, mscale)) @ params["W_o"])  # (B, n, d)
        start += n
    return torch.cat(outs, dim=1), cache


# ---------------------------------------------------------------------------
# RoPE scaling and partial rotary (protocol v2): the twin of the same section of reference.numpy (read it there); the
# scalar settings (YaRN's correction range and magnitude, the rotated width) are computed once, there.
# ---------------------------------------------------------------------------


def inverse_frequencies(d, base):
    """(d/2,) θ_i = base^(-2i/d), float64."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def rope_frequencies(d_head, base, scaling, seq_len):
    """(inv_freq (d/2,) float64, attention_factor) of a scaled RoPE for sequences of seq_len positions."""
    kind = scaling["rope_type"]
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type={kind!r} is not one of {', '.join(ROPE_TYPES)}")
    theta = inverse_frequencies(d_head, base)
    s = scaling.get("factor", 1.0)
    if kind == "linear":
        return theta / s, 1.0
    if kind == "dynamic":
        original = scaling["original_max_position_embeddings"]
        grown = base * (s * max(seq_len, original) / original - (s - 1)) ** (d_head / (d_head - 2))
        return inverse_frequencies(d_head, grown), 1.0
    if kind == "llama3":
        original, low, high = scaling["original_max_position_embeddings"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelength = 2 * math.pi / theta
        smooth = (original / wavelength - low) / (high - low)
        scaled = torch.where(wavelength > original / low, theta / s, theta)
        in_band = (wavelength >= original / high) & (wavelength <= original / low)
        return torch.where(in_band, (1 - smooth) * theta / s + smooth * theta, scaled), 1.0
    if kind == "yarn":
        low, high = yarn_correction_range(d_head, base, scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1,
                                                 scaling["original_max_position_embeddings"], scaling.get("truncate", True))
        high = high + 0.001 if low == high else high
        ramp = ((torch.arange(d_head // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        factor = (yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim) if mscale and mscale_all_dim
                  else yarn_mscale(s))
        return theta / s * ramp + theta * (1 - ramp), factor
    if kind == "longrope":
        original = scaling["original_max_position_embeddings"]
        chosen = torch.tensor(scaling["long_factor"] if seq_len > original else scaling["short_factor"], dtype=torch.float64)
        ratio = scaling["max_position_embeddings"] / original
        return theta / chosen, 1.0 if ratio <= 1 else math.sqrt(1 + math.log(ratio) / math.log(original))
    return theta, 1.0


def softmax_scale(d_head, scaling):
    """1/√d_head, times yarn_mscale(s, mscale_all_dim)² where a YaRN config sets mscale_all_dim (DeepSeek-V2/V3)."""
    scale = d_head**-0.5
    if scaling["rope_type"] == "yarn" and scaling.get("mscale_all_dim"):
        scale = scale * yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
    return scale


def partial_rope(x, positions, base, partial_rotary_factor, *, pairing="half_split"):
    """RoPE on the first int(D · factor) features of each head, frequencies over that width; the rest untouched."""
    rotary = rotary_width(x.shape[-1], partial_rotary_factor)
    return torch.cat([rope(x[..., :rotary], positions, base, pairing=pairing), x[..., rotary:]], dim=-1)


# ---------------------------------------------------------------------------
# Attention scores as shipped: ALiBi (BLOOM, MPT, Baichuan), softcapping (Gemma 2, Grok), attention sinks (gpt-oss)
# ---------------------------------------------------------------------------


def alibi_slopes(n_heads):
    """ALiBi's head slopes (H,) float64: geometric from 2^(-8/H) for H a power of two; otherwise the largest power of two P's,
    then every other slope of 2P (Press et al. 2022; BLOOM's build_alibi_tensor)."""
    closest = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = 2.0 ** (-8.0 * torch.arange(1, closest + 1, dtype=torch.float64) / closest)
    extra = 2.0 ** (-4.0 * (2 * torch.arange(n_heads - closest, dtype=torch.float64) + 1) / closest)  # 2P's slopes 1, 3, 5, ...
    return torch.cat([slopes, extra])


def scores_and_visible(q, k, v, causal, key_mask, window):
    """q·kᵀ/√D (B, H, T, S), where each query may look (B, H, T, S) and the values (B, H, S, D) of gqa_attention's call."""
    H, T, D = q.shape[1:]
    S = k.shape[2]
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, S)
    visible = visible_keys(T, S, causal, window, q.device)[None, None]
    if key_mask is not None:
        visible = visible & key_mask.to(torch.bool)[:, None, None, :]
    return scores, visible.expand(scores.shape), v


def alibi_attention(q, k, v, slopes, key_mask, *, fully_masked="zeros"):
    """Causal GQA with ALiBi: head h adds -slopes[h]·(S - T + i - j) to query i's scaled score of key j."""
    T, S = q.shape[2], k.shape[2]
    scores, visible, v = scores_and_visible(q, k, v, True, key_mask, None)
    distance = (torch.arange(S - T, S, device=q.device)[:, None] - torch.arange(S, device=q.device)[None, :]).to(q.dtype)  # (T, S)
    weights = masked_softmax(scores - slopes.to(q.dtype)[:, None, None] * distance, visible, fully_masked=fully_masked)
    return weights @ v, weights


def softcap(x, cap):
    """cap·tanh(x / cap)."""
    return cap * torch.tanh(x / cap)


def softcapped_attention(q, k, v, causal, key_mask, window, cap, *, fully_masked="zeros"):
    """gqa_attention with the scaled scores softcapped before the mask (Gemma 2)."""
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    weights = masked_softmax(softcap(scores, cap), visible, fully_masked=fully_masked)
    return weights @ v, weights


def sink_attention(q, k, v, causal, key_mask, window, sinks):
    """gqa_attention with gpt-oss's sinks: sinks[h] joins each row's softmax as a column, then dropped."""
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    sink = sinks.to(scores.dtype)[:, None, None].expand(scores.shape[:-1] + (1,))  # (B, H, T, 1)
    seen = torch.cat([visible, torch.ones_like(visible[..., :1])], dim=-1)
    weights = masked_softmax(torch.cat([scores, sink], dim=-1), seen)[..., :-1]
    return weights @ v, weights


# ---------------------------------------------------------------------------
# Gemma's details (protocol v2): GeGLU with the tanh GELU, the scaled embedding, RMSNorm's (1 + w) in float32
# (reference.numpy cites the sources)
# ---------------------------------------------------------------------------


def geglu(x, W_gate, W_up, W_down):
    """GeGLU feed-forward: (GELU(x·W_gate) ⊙ x·W_up)·W_down with the tanh GELU (Gemma's gelu_pytorch_tanh). (..., d) -> (..., d)."""
    return (gelu(x @ W_gate) * (x @ W_up)) @ W_down


def scaled_embedding(ids, table):
    """Gemma's embedding: the rows table[ids] times √d rounded to the table's dtype. (...) int, (V, d) -> (..., d)."""
    normaliser = torch.tensor(math.sqrt(table.shape[-1]), dtype=table.dtype, device=table.device)  # rounded to the dtype first
    return table[ids] * normaliser


def gemma_rms_norm(x, w, eps):
    """Gemma's RMSNorm: x / √(mean(x²) + eps) · (1 + w), computed in float32 at least and rounded back to x's dtype once."""
    work = torch.promote_types(x.dtype, torch.float32)
    y = x.to(work)
    return (y / torch.sqrt((y * y).mean(dim=-1, keepdim=True) + eps) * (1 + w.to(work))).to(x.dtype)


# ---------------------------------------------------------------------------
# Per-layer attention types (protocol v2): local and global layers, each type with its own RoPE base (sources: numpy.py)
# ---------------------------------------------------------------------------

LAYER_TYPES = ("sliding_attention", "full_attention")  # transformers' names: a window of `window` keys, or every key


def layer_attention(layer_types, window, rope_bases):
    """[(window or None, RoPE base)] per layer: a "sliding_attention" layer sees its last `window` keys at rope_bases["sliding_attention"],
    a "full_attention" one every key at rope_bases["full_attention"]; ValueError for any other type."""
    unknown = sorted({str(t) for t in layer_types} - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"layer types {unknown} are not {' or '.join(LAYER_TYPES)}")
    return [(window if kind == "sliding_attention" else None, float(rope_bases[kind])) for kind in layer_types]


def hybrid_decode(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases, chunks=None, *, pairing="half_split", eps=EPS):
    """llama_decode with per-layer attention types (layer_attention): (logits (B, T, V), cache_positions (n, L, H_kv, S))."""
    if len(layer_types) != len(params["blocks"]):
        raise ValueError(f"{len(layer_types)} layer types for {len(params['blocks'])} blocks")
    return decode_layers(ids, params, n_heads, n_kv_heads, layer_attention(layer_types, window, rope_bases), chunks, pairing=pairing,
                         eps=eps)


def hybrid_logits(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases, *, pairing="half_split", eps=EPS):
    """llama_logits with per-layer attention types: layer i sliding (window, rope_bases["sliding_attention"]) or full. (B, T) -> (B, T, V)."""
    logits, _ = hybrid_decode(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases, [ids.shape[1]], pairing=pairing, eps=eps)
    return logits


# ---------------------------------------------------------------------------
# StreamingLLM (protocol v2): the first n_sink tokens and the last cache_size - n_sink, RoPE within the cache (sources: numpy.py)
# ---------------------------------------------------------------------------


def streaming_held(t, n_sink, cache_size):
    """The tokens a streaming cache holds once token t is in, in slot order: the first n_sink, then the last cache_size - n_sink."""
    recent = range(max(n_sink, t + 1 - (cache_size - n_sink)), t + 1)  # the window, t itself included
    return [*range(min(n_sink, t + 1)), *recent]


def streaming_attention(q, k, v, n_sink, cache_size, rope_base=ROPE_BASE, *, pairing="half_split"):
    """Query t attends the keys streaming_held(t) at RoPE positions 0 .. m - 1 within the cache, itself at m - 1.
    q (B, H, T, D), k and v (B, H_kv, T, D) -> out (B, H, T, D), weights (B, H, T, T)."""
    B, H, T, D = q.shape
    out, weights = torch.zeros_like(q), torch.zeros(B, H, T, T, dtype=q.dtype, device=q.device)
    for t in range(T):
        held = streaming_held(t, n_sink, cache_size)
        m = len(held)
        query = rope(q[:, :, t:t + 1], [m - 1], rope_base, pairing=pairing)  # (B, H, 1, D)
        keys = rope(k[:, :, held], torch.arange(m), rope_base, pairing=pairing)  # (B, H_kv, m, D)
        out[:, :, t:t + 1], weights[:, :, t:t + 1, held] = gqa_attention(query, keys, v[:, :, held], False)
    return out, weights


def streaming_decode(q, k, v, n_sink, cache_size, rope_base=ROPE_BASE, *, pairing="half_split"):
    """(out (B, H, T, D), held (T, cache_size) int64): streaming_attention's out and the tokens in the slots after each step (-1: empty)."""
    T = q.shape[2]
    held = torch.full((T, cache_size), -1, dtype=torch.int64, device=q.device)
    for t in range(T):
        tokens = streaming_held(t, n_sink, cache_size)
        held[t, :len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
    return streaming_attention(q, k, v, n_sink, cache_size, rope_base, pairing=pairing)[0], held
