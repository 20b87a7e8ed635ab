"""Reference transformer in numpy: every function of the implementation protocol, written to be read.

Sources: Vaswani et al. 2017 (attention, the block), Radford et al. 2019 (GPT-2: pre-norm,
tanh GELU, learned positions, tied output), Hendrycks & Gimpel 2016 (GELU, both forms), Ba et
al. 2016 (LayerNorm), Zhang & Sennrich 2019 (RMSNorm), Fedus, Zoph & Shazeer 2021 (Switch: the
balancing loss), Jiang et al. 2024 (Mixtral: softmax over the kept top-k scores); the modern
decoder at the end of the file (protocol v2) cites its own.

The protocol's functions are called positionally; the keyword-only options (gelu_form, eps,
pairing, fully_masked) are the suite's: they let the reference follow an implementation's declared conventions
(invariants/conventions.py), e.g. transformer_block(x, params, n_heads, causal, gelu_form="erf").

Dimension letters, used in every shape comment:
    B batch, T sequence, d model width, H heads, D head width (d = H·D),
    F feed-forward width (4·d), V vocabulary, N tokens, E experts.
"""

from __future__ import annotations

import math

import numpy as np

from invariants.reference.counts import (  # noqa: F401  (part of this module's protocol surface)
    gpt_param_count,
    inference_flops_per_token,
    moe_active_params,
    moe_n_params,
    training_flops,
)
from invariants.reference.surface import surface
from invariants.reference.text import build_vocab, decode, encode, get_batch  # noqa: F401

__getattr__ = surface(__name__)  # __all__: every protocol function and constant the module holds (invariants.reference.surface)

BACKEND = "numpy"
PROTOCOL_VERSION = 2
EPS = 1e-5  # keeps the norms finite when every value in a row is equal
GELU_FORMS = ("tanh", "erf")  # GPT-2's tanh approximation (the default here), and the exact x·Φ(x)
ATTENTION_BIAS_NAMES = ("b_q", "b_k", "b_v", "b_o")  # the optional block params

# Declared conventions (invariants/conventions.py): what the suite may assume of this implementation.
GELU_FORM = "tanh"  # gelu(x) and everything built on it use the tanh form unless asked for another
ATTENTION_BIASES = True  # transformer_block and gpt_logits read b_q, b_k, b_v, b_o when the params hold them

# ---------------------------------------------------------------------------
# Softmax and the loss
# ---------------------------------------------------------------------------


def softmax(x, axis=-1):
    """exp(x) / Σ exp(x) along `axis`; the row maximum is subtracted first so exp never overflows."""
    # In place after the subtraction: a fresh (B, H, T, T) array of a long sequence costs more than its exp (its pages, faulted in).
    with np.errstate(invalid="ignore"):  # a row of -inf alone (every key masked) is NaN: -inf - -inf
        e = np.asarray(x - x.max(axis=axis, keepdims=True), dtype=np.result_type(x, np.float16))  # a new array of floats
    np.exp(e, out=e)  # a masked -inf becomes exactly 0 here
    # Times the reciprocal, not divided: within an ulp of the division, and it rounds unlike the textbook code, so a submission
    # answering with this code's bits shows (invariants.gate.bitwise, evidence of a copy that hides its source).
    e *= 1 / e.sum(axis=axis, keepdims=True)
    return e


def log_softmax(x, axis=-1):
    """log(softmax(x)) computed as x - logsumexp(x): no log of an underflowed 0."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def cross_entropy(logits, targets):
    """Mean negative log-probability of the targets, in nats: (..., V), (...) -> scalar."""
    log_probs = log_softmax(logits)  # (..., V)
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)  # (..., 1)
    return -picked.mean()


# ---------------------------------------------------------------------------
# Norms and the activation
# ---------------------------------------------------------------------------


def _statistics_dtype(x):
    """The dtype a norm squares x in: float32 for 16-bit rows (x² overflows float16 past |x| ≈ 256: 65504 is its largest
    value), x's own otherwise; torch's norm kernels and transformers' RMSNorm upcast alike."""
    return np.promote_types(x.dtype, np.float32)


def layer_norm(x, gain, bias, eps=EPS):
    """Normalise each row (one token's features) to mean 0 and variance 1, then scale and shift.

    The variance is the population one (divide by d, not d - 1), and eps sits inside the
    square root, as in torch.nn.LayerNorm and GPT-2. In float32 at least (_statistics_dtype), rounded back to x's dtype once.
    """
    y = x.astype(_statistics_dtype(x), copy=False)
    mean = y.mean(axis=-1, keepdims=True)  # (..., 1)
    centred = y - mean  # (..., d)
    var = (centred * centred).mean(axis=-1, keepdims=True)  # (..., 1)
    normed = centred * (1 / np.sqrt(var + eps)) * gain + bias  # times the reciprocal, as in softmax: bits unlike the textbook's
    return normed.astype(x.dtype, copy=False)


def rms_norm(x, gain, eps=EPS):
    """Divide each row by its root mean square, then scale: LayerNorm without centring or bias, in float32 at least
    (_statistics_dtype), rounded back to x's dtype once."""
    y = x.astype(_statistics_dtype(x), copy=False)
    mean_square = (y * y).mean(axis=-1, keepdims=True)  # (..., 1)
    return (y / np.sqrt(mean_square + eps) * gain).astype(x.dtype, copy=False)


def gelu(x):
    """GELU, tanh approximation: the form GPT-2 and BERT use (gelu_erf is the exact x·Φ(x); they differ by < 4.73e-4)."""
    # math.sqrt gives a Python float: a numpy float64 scalar would promote float32 inputs to float64
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


_erf = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf: math.erf elementwise, as an object array (cast back below)


def gelu_erf(x):
    """GELU, exact form x·Φ(x) = 0.5·x·(1 + erf(x/√2)): torch's nn.GELU() default."""
    return 0.5 * x * (1.0 + np.asarray(_erf(x / math.sqrt(2.0)), dtype=np.result_type(x)))


def gelu_of(form):
    """The GELU of `form`: "tanh" (gelu, the default everywhere here) or "erf" (gelu_erf)."""
    if form not in GELU_FORMS:
        raise ValueError(f"gelu_form={form!r} is not one of {', '.join(GELU_FORMS)}")
    return gelu if form == "tanh" else gelu_erf


# ---------------------------------------------------------------------------
# Attention and the feed-forward network
# ---------------------------------------------------------------------------


def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    """Multi-head scaled dot-product self-attention: (B, T, d) -> (B, T, d) and weights (B, H, T, T).

    The biases are optional (GPT-2 has them; the protocol does not require them).
    """
    B, T, d = x.shape
    D = d // n_heads

    def split_heads(W, b):
        y = x @ W if b is None else x @ W + b  # (B, T, d)
        return y.reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)  # (B, H, T, D)

    q, k, v = split_heads(W_q, b_q), split_heads(W_k, b_k), split_heads(W_v, b_v)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)  # (B, H, T, D) x (B, H, D, T) -> (B, H, T, T)
    if causal:
        future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): True where key > query
        scores = np.where(future, -np.inf, scores)  # mask BEFORE the softmax
    weights = softmax(scores)  # (B, H, T, T), rows sum to 1
    heads = weights @ v  # (B, H, T, T) x (B, H, T, D) -> (B, H, T, D)
    merged = heads.transpose(0, 2, 1, 3).reshape(B, T, d)  # (B, T, H, D) -> (B, T, d)
    out = merged @ W_o if b_o is None else merged @ W_o + b_o  # (B, T, d)
    return out, weights


def feed_forward(x, W1, b1, W2, b2, *, gelu_form="tanh"):
    """Position-wise network d -> F -> d with a GELU between: (..., d) -> (..., d)."""
    return gelu_of(gelu_form)(x @ W1 + b1) @ W2 + b2  # (..., d) x (d, F) -> (..., F) x (F, d) -> (..., d)


# ---------------------------------------------------------------------------
# The block and the model
# ---------------------------------------------------------------------------

def transformer_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    """Pre-norm block: x + Attn(LN(x)), then + FFN(LN(x)). (B, T, d) -> (B, T, d).

    `params` holds ln1_g, ln1_b, W_q, W_k, W_v, W_o, ln2_g, ln2_b, W1, b1, W2, b2,
    and optionally the attention biases b_q, b_k, b_v, b_o.
    """
    p = params
    biases = {name: p[name] for name in ATTENTION_BIAS_NAMES if name in p}
    normed = layer_norm(x, p["ln1_g"], p["ln1_b"], eps)
    attn_out, _ = attention(normed, p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal, **biases)
    x = x + attn_out  # residual: add a correction, never replace the signal
    x = x + feed_forward(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)
    return x


def check_token_ids(ids, vocab, max_len):
    """Raise ValueError naming the problem if ids are not (B, T) integers in [0, vocab) with T <= max_len."""
    if ids.ndim != 2:
        raise ValueError(f"ids must be (batch, seq), got shape {tuple(ids.shape)}")
    if ids.shape[1] > max_len:
        raise ValueError(f"sequence length {ids.shape[1]} exceeds max_len {max_len}: learned positions stop there")
    if 0 not in ids.shape and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")


def gpt_logits(ids, params, n_heads, *, gelu_form="tanh", eps=EPS):
    """Decoder-only language model, GPT-2 style: (B, T) token ids -> (B, T, V) next-token logits.

    `params` holds wte (V, d), wpe (max_len, d), blocks (a list of block params),
    lnf_g and lnf_b. The output layer is the token table transposed (weight tying).
    """
    wte, wpe = params["wte"], params["wpe"]
    ids = np.asarray(ids)
    check_token_ids(ids, vocab=wte.shape[0], max_len=wpe.shape[0])
    T = ids.shape[1]
    x = wte[ids] + wpe[:T]  # (B, T, d): what + where
    for block in params["blocks"]:
        x = transformer_block(x, block, n_heads, causal=True, gelu_form=gelu_form, eps=eps)
    h = layer_norm(x, params["lnf_g"], params["lnf_b"], eps)  # (B, T, d)
    return h @ wte.T  # (B, T, d) x (d, V) -> (B, T, V)


# ---------------------------------------------------------------------------
# Mixture of experts
# ---------------------------------------------------------------------------


def top_k_indices(router_logits, k):
    """The k highest-scoring experts per token, best first; ties go to the lower index. (N, E) -> (N, k)."""
    # A stable sort of the negated scores is a descending sort that keeps tied experts in index order.
    return np.argsort(-router_logits, axis=-1, kind="stable")[..., :k]


def top_k_gates(router_logits, k):
    """(N, E) router scores -> (N, E) gates: a softmax over each token's k kept scores, 0 elsewhere."""
    top = top_k_indices(router_logits, k)  # (N, k)
    kept = np.take_along_axis(router_logits, top, axis=-1)  # (N, k)
    gates = np.zeros_like(router_logits)
    np.put_along_axis(gates, top, softmax(kept), axis=-1)
    return gates


def expert(x, params, *, gelu_form="tanh"):
    """One expert of moe on x (..., d) -> (..., d): the GELU feed-forward network {W1, b1, W2, b2}, or the SwiGLU one {W_gate, W_up, W_down}."""
    return swiglu(x, **params) if "W_gate" in params else feed_forward(x, **params, gelu_form=gelu_form)


def moe(x, router, experts, k, *, gelu_form="tanh"):
    """Sparse mixture of experts: each token gets the gate-weighted sum of its top-k experts. (N, d) -> (N, d).

    `router` is (d, E); `experts` is a list of E expert params: feed-forward (W1, b1, W2, b2) or SwiGLU (W_gate, W_up, W_down).
    """
    gates = top_k_gates(x @ router, k)  # (N, d) x (d, E) -> (N, E)
    out = np.zeros_like(x)
    for e, params in enumerate(experts):
        chosen = gates[:, e] > 0  # (N,): an expert runs only on the tokens routed to it
        if chosen.any():
            out[chosen] += gates[chosen, e : e + 1] * expert(x[chosen], params, gelu_form=gelu_form)
    return out


def tokens_per_expert(router_logits, k):
    """How many tokens each expert receives under top-k routing: (N, E) -> (E,), summing to N·k."""
    return np.bincount(top_k_indices(router_logits, k).ravel(), minlength=router_logits.shape[-1])


def load_balancing_loss(router_logits, k):
    """Switch auxiliary loss E · Σ_i f_i · P_i: f_i the share of the N·k routing slots expert i got, P_i its mean probability."""
    N, E = router_logits.shape
    f = (tokens_per_expert(router_logits, k) / (N * k)).astype(router_logits.dtype)  # (E,), sums to 1
    P = softmax(router_logits).mean(axis=0)  # (E,)
    return E * np.sum(f * P)


# ---------------------------------------------------------------------------
# The modern decoder (protocol v2): RoPE, grouped-query attention, SwiGLU, the Llama block and
# model with a KV cache, cross-attention and the encoder-decoder block.
#
# Sources: Su et al. 2021 (RoFormer: rotary embeddings), Ainslie et al. 2023 (GQA), Shazeer 2020
# (GLU variants: SwiGLU), Touvron et al. 2023 (Llama: RMSNorm pre-norm, SwiGLU, RoPE), Jiang et
# al. 2023 (Mistral: the sliding window), Vaswani et al. 2017 (cross-attention).
# Extra letters: H_kv key/value heads (H divisible by H_kv), S keys (S >= T: a KV cache holds
# S - T earlier positions), w the sliding window, L layers.
# ---------------------------------------------------------------------------

ROPE_BASE = 10_000.0  # Llama 1 and 2; Llama 3 uses 500,000: the base is an argument everywhere
ROPE_PAIRINGS = ("half_split", "interleaved")  # pairs (i, i + D/2): HF, GPT-NeoX; pairs (2i, 2i + 1): Meta's Llama, GPT-J
FULLY_MASKED = ("zeros", "uniform")  # what a query that sees no key gets: zero weights, or 1/S on every key

# Declared conventions of the additions (invariants/conventions.py).
ROPE_PAIRING = "half_split"
QKV_BIASES = True  # llama_block, llama_logits and llama_decode read b_q, b_k, b_v when the params hold them (Qwen2)
FULLY_MASKED_ROWS = "zeros"


def rope_angles(positions, D, base=ROPE_BASE):
    """(T,) positions -> (T, D/2) angles p·θ_i with θ_i = base^(-2i/D), in float64 whatever the model's dtype.

    The angle is computed in float64 and only its cos and sin are rounded to the model's dtype:
    positions rounded to bfloat16 (8 bits) are wrong from 256 on.
    """
    inv_freq = inverse_frequencies(D, base)  # (D/2,): θ_0 = 1 down to θ_{D/2-1} ≈ 1/base
    return np.asarray(positions, dtype=np.float64)[:, None] * inv_freq  # (T, 1) x (D/2,) -> (T, D/2)


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
        return np.concatenate([first, second], axis=-1)
    return np.stack([first, second], axis=-1).reshape(*first.shape[:-1], -1)  # (..., D/2, 2) -> (..., D)


def rope(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    """Rotary position embedding: rotate pair i of the vector at position p by the angle p·θ_i. (..., T, D) -> (..., T, D).

    A rotation, so q_m·k_n depends on m - n only, every pair keeps its norm, and position 0 is the identity.
    """
    angles = rope_angles(positions, x.shape[-1], base)  # (T, D/2)
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)  # (T, D/2)
    first, second = rope_pairs(x, pairing)  # (..., T, D/2) each
    return rope_join(first * cos - second * sin, first * sin + second * cos, pairing)  # counter-clockwise by p·θ_i


def visible_keys(T, S, causal=True, window=None):
    """(T, S) True where query i may see key j: the T queries are the last T of the S positions (bottom-right aligned).

    Query i sits at position S - T + i. Causal: it sees j <= S - T + i. A window w keeps the w
    most recent of those, S - T + i - w < j, so exactly min(S - T + i + 1, w) keys (Mistral's rule).
    """
    query_position = np.arange(S - T, S)[:, None]  # (T, 1): where each query sits among the keys
    key_position = np.arange(S)[None, :]  # (1, S)
    visible = np.ones((T, S), dtype=bool)
    if causal:
        visible &= key_position <= query_position
        if window is not None:
            visible &= key_position > query_position - window
    return visible


def masked_softmax(scores, visible, *, fully_masked="zeros"):
    """softmax over the visible entries of each row (invisible ones get exactly 0); a row with none visible gets `fully_masked`.

    The mask is a boolean select, never an additive -1e9 or finfo.min (which overflow to -inf in 16 bits,
    and two of which add to -inf in any dtype), and a row with no visible key never computes 0/0.
    """
    if fully_masked not in FULLY_MASKED:
        raise ValueError(f"fully_masked={fully_masked!r} is not one of {', '.join(FULLY_MASKED)}")
    any_visible = visible.any(axis=-1, keepdims=True)  # (..., 1)
    scores = np.where(visible, scores, -np.inf)  # mask BEFORE the softmax
    scores = np.where(any_visible, scores, 0.0)  # a row with no visible key: all 0, so its softmax is 1/S, finite
    weights = softmax(scores)
    return weights if fully_masked == "uniform" else np.where(any_visible, weights, 0.0)


def repeat_kv(k, group):
    """(B, H_kv, S, D) -> (B, H_kv·group, S, D): kv head g serves query heads g·group .. (g+1)·group - 1 (repeat-interleave)."""
    return np.repeat(k, group, axis=1)  # [kv0, kv0, kv1, kv1], never the tiling [kv0, kv1, kv0, kv1]


def gqa_attention(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
    """Grouped-query attention core: q (B, H, T, D), k and v (B, H_kv, S, D) -> out (B, H, T, D), weights (B, H, T, S).

    H_kv = H is multi-head attention, H_kv = 1 multi-query attention. With T < S the queries are
    the last T positions (a KV cache holds the first S - T). key_mask (B, S) is True for the keys
    that may be seen (False: padding); window (with causal) keeps the w most recent keys.
    """
    B, H, T, D = q.shape
    S = k.shape[2]
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])  # (B, H, S, D)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(D)  # (B, H, T, D) x (B, H, D, S) -> (B, H, T, S)
    visible = visible_keys(T, S, causal, window)  # (T, S)
    if key_mask is not None:
        visible = visible & np.asarray(key_mask, dtype=bool)[:, None, None, :]  # (B, 1, T, S)
    weights = masked_softmax(scores, np.broadcast_to(visible, scores.shape), fully_masked=fully_masked)  # (B, H, T, S)
    return weights @ v, weights  # (B, H, T, S) x (B, H, S, D) -> (B, H, T, D)


def sigmoid(x):
    """1 / (1 + exp(-x)) without overflow: exp of -|x| only."""
    e = np.exp(-np.abs(x))  # in (0, 1]
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x):
    """SiLU (swish): x·σ(x)."""
    return x * sigmoid(x)


def swiglu(x, W_gate, W_up, W_down):
    """SwiGLU feed-forward: (SiLU(x·W_gate) ⊙ x·W_up)·W_down. (..., d) -> (..., d); the SiLU is on the gate branch only."""
    return (silu(x @ W_gate) * (x @ W_up)) @ W_down  # (..., F) ⊙ (..., F) -> (..., F) x (F, d) -> (..., d)


def split_heads(y, n_heads):
    """(B, T, H·D) -> (B, H, T, D): head h takes the contiguous features h·D:(h+1)·D."""
    B, T, width = y.shape
    return y.reshape(B, T, n_heads, width // n_heads).transpose(0, 2, 1, 3)


def merge_heads(y):
    """(B, H, T, D) -> (B, T, H·D), the inverse of split_heads."""
    B, H, T, D = y.shape
    return y.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def project(x, W, b=None):
    """x·W (+ b): (..., d_in) x (d_in, d_out) -> (..., d_out)."""
    return x @ W if b is None else x @ W + b


def chunk_positions(past_length, n):
    """The positions of n new tokens after past_length cached ones: past_length .. past_length + n - 1."""
    return np.arange(past_length, past_length + n)


def llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    """Llama's attention sublayer on new tokens x (B, T, d) at `positions`, after a cache of (k, v), each (B, H_kv, S_past, D).

    The cache is (k, v, key positions (S_past,)); returns the output (B, T, d) and the cache extended by these
    tokens' keys and values (RoPE'd keys, plain values: RoPE rotates q and k, never v) and positions.
    Optional biases b_q, b_k, b_v (Qwen2) are read from p.
    """
    q = split_heads(project(x, p["W_q"], p.get("b_q")), n_heads)  # (B, H, T, D)
    k = split_heads(project(x, p["W_k"], p.get("b_k")), n_kv_heads)  # (B, H_kv, T, D)
    v = split_heads(project(x, p["W_v"], p.get("b_v")), n_kv_heads)  # (B, H_kv, T, D)
    q, k = rope(q, positions, rope_base, pairing=pairing), rope(k, positions, rope_base, pairing=pairing)
    held = np.asarray(positions)  # (T,): the positions of the keys in the cache
    if cache is not None:
        k, v = np.concatenate([cache[0], k], axis=2), np.concatenate([cache[1], v], axis=2)  # (B, H_kv, S_past + T, D)
        held = np.concatenate([cache[2], held])  # (S_past + T,)
    heads, _ = gqa_attention(q, k, v, True, None, window)  # (B, H, T, D): the new queries are the last T positions
    return merge_heads(heads) @ p["W_o"], (k, v, held)  # (B, T, H·D) x (H·D, d) -> (B, T, d)


def llama_block_step(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=EPS):
    """One Llama block on new tokens x (B, T, d) at `positions`: (out (B, T, d), the extended cache)."""
    p = params
    attended, cache = llama_attention(rms_norm(x, p["attn_norm"], eps), p, n_heads, n_kv_heads, positions, rope_base, window, cache,
                                      pairing=pairing)
    h = x + attended  # pre-norm residual, as in GPT-2's block, with RMSNorm
    return h + swiglu(rms_norm(h, p["ffn_norm"], eps), p["W_gate"], p["W_up"], p["W_down"]), cache


def llama_block(x, params, n_heads, n_kv_heads, rope_base=ROPE_BASE, window=None, *, pairing="half_split", eps=EPS):
    """Llama's pre-norm decoder block on a whole sequence: x + Attn(RMSNorm(x)), then + SwiGLU(RMSNorm(x)). (B, T, d) -> (B, T, d).

    `params` holds attn_norm (d,), W_q (d, H·D), W_k and W_v (d, H_kv·D), W_o (H·D, d), ffn_norm (d,),
    W_gate and W_up (d, F), W_down (F, d), and optionally b_q, b_k, b_v. Always causal; positions 0 .. T - 1.
    """
    out, _ = llama_block_step(x, params, n_heads, n_kv_heads, rope_base, window, chunk_positions(0, x.shape[1]),
                              pairing=pairing, eps=eps)
    return out


def check_vocab_ids(ids, vocab):
    """Raise ValueError unless ids are (B, T) integers in [0, vocab) (RoPE has no max_len)."""
    if ids.ndim != 2:
        raise ValueError(f"ids must be (batch, seq), got shape {tuple(ids.shape)}")
    if 0 not in ids.shape and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")


def llama_logits(ids, params, n_heads, n_kv_heads, rope_base=ROPE_BASE, window=None, *, pairing="half_split", eps=EPS):
    """Llama-style language model: (B, T) ids -> (B, T, V) logits. Every block causal, positions from 0, an untied head.

    `params` holds embed (V, d), blocks (a list of llama_block params), norm (d,) and W_out (d, V).
    """
    logits, _ = llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, [np.shape(ids)[1]], pairing=pairing, eps=eps)
    return logits


def cache_positions(caches, n_kv_heads):
    """(n, L, H_c, S) from each chunk's cache: the position of the key in each slot of each layer and stored head, -1 where empty.

    H_c is the number of heads a cache stores (H_kv, unless keys are kept per query head); S the most slots any held.
    """
    heads = caches[0][0][0].shape[1] if caches and caches[0] else n_kv_heads
    slots = max((len(held) for cache in caches for _, _, held in cache), default=0)
    table = np.full((len(caches), len(caches[0]) if caches else 0, heads, slots), -1, dtype=np.int64)
    for i, cache in enumerate(caches):
        for layer, (_, _, held) in enumerate(cache):
            table[i, layer, :, : len(held)] = held  # every head of a layer holds the same positions
    return table


def llama_decode(ids, params, n_heads, n_kv_heads, rope_base=ROPE_BASE, window=None, chunks=None, *, pairing="half_split", eps=EPS):
    """Incremental decoding: a prefill of chunks[0] tokens, then each further chunk on the cache. -> (logits (B, T, V), cache_positions).

    chunks are positive ints summing to T (None: one chunk, the whole sequence). The cache holds every
    layer's keys and values with their positions: after t tokens, positions 0 .. t - 1 once each, which
    cache_positions (n, L, H_kv, S) reports after each chunk (-1 in the slots not yet filled).
    """
    return decode_layers(ids, params, n_heads, n_kv_heads, [(window, rope_base)] * len(params["blocks"]), chunks, pairing=pairing,
                         eps=eps)


def decode_layers(ids, params, n_heads, n_kv_heads, layers, chunks=None, *, pairing="half_split", eps=EPS):
    """llama_decode with each layer's own attention: layers [(window or None, rope_base)], one per block (Gemma 2 and 3, gpt-oss,
    Qwen2's max_window_layers: hybrid_decode). -> (logits (B, T, V), cache_positions (n, L, H_kv, S))."""
    ids = np.asarray(ids)
    check_vocab_ids(ids, params["embed"].shape[0])
    T = ids.shape[1]
    chunks = [T] if chunks is None else [int(n) for n in np.asarray(chunks).reshape(-1)]
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
        logits.append(rms_norm(x, params["norm"], eps) @ params["W_out"])  # (B, n, d) x (d, V) -> (B, n, V)
        caches.append(list(cache))  # as it stands after this chunk
        start += n
    return np.concatenate(logits, axis=1), cache_positions(caches, n_kv_heads)


def cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads):
    """Cross-attention: queries from the decoder stream x (B, T, d), keys and values from the encoder's memory (B, S, d).

    No mask: every decoder position sees every encoder position. -> out (B, T, d), weights (B, H, T, S).
    """
    q = split_heads(x @ W_q, n_heads)  # (B, H, T, D)
    k, v = split_heads(memory @ W_k, n_heads), split_heads(memory @ W_v, n_heads)  # (B, H, S, D)
    heads, weights = gqa_attention(q, k, v, False, None, None)  # (B, H, T, D), (B, H, T, S)
    return merge_heads(heads) @ W_o, weights  # (B, T, d)


def decoder_block(x, memory, params, n_heads, *, gelu_form="tanh", eps=EPS):
    """The encoder-decoder transformer's decoder block, pre-norm: causal self-attention, cross-attention, feed-forward. (B, T, d) -> (B, T, d).

    `params` holds ln1_g ln1_b W_q W_k W_v W_o (self-attention), ln2_g ln2_b Wc_q Wc_k Wc_v Wc_o
    (cross-attention), ln3_g ln3_b W1 b1 W2 b2 (feed-forward). memory (B, S, d) is the encoder's output.
    """
    p = params
    x = x + attention(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, True)[0]
    x = x + cross_attention(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), memory, p["Wc_q"], p["Wc_k"], p["Wc_v"], p["Wc_o"], n_heads)[0]
    return x + feed_forward(layer_norm(x, p["ln3_g"], p["ln3_b"], eps), p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)


def qk_norm_attention(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    """Causal GQA with QK-norm: each head's queries and keys RMS-normalised over D, then RoPE. -> out (B, T, d), weights (B, H, T, T).

    As in Qwen3 and Gemma 3 (Dehghani et al. 2023 normalised q and k to keep the scores bounded): `params` holds
    W_q (d, H·D), W_k and W_v (d, H_kv·D), W_o (H·D, d), and the gains q_norm and k_norm (D,), each shared by
    every head. The norm comes before RoPE (a rotation keeps a vector's root mean square, but not a gain that
    differs within a pair), and the values are never normalised. x (B, T, d) sits at `positions` (T,) int.
    """
    p = params
    q = rms_norm(split_heads(x @ p["W_q"], n_heads), p["q_norm"], eps)  # (B, H, T, D), each head over its own D features
    k = rms_norm(split_heads(x @ p["W_k"], n_kv_heads), p["k_norm"], eps)  # (B, H_kv, T, D)
    v = split_heads(x @ p["W_v"], n_kv_heads)  # (B, H_kv, T, D): not normalised
    q, k = rope(q, positions, rope_base, pairing=pairing), rope(k, positions, rope_base, pairing=pairing)
    heads, weights = gqa_attention(q, k, v, True, None, None)  # (B, H, T, D), (B, H, T, T)
    return merge_heads(heads) @ p["W_o"], weights  # (B, T, H·D) x (H·D, d) -> (B, T, d)


# ---------------------------------------------------------------------------
# MoE routing as shipped (protocol v2): DeepSeek-V3's grouped sigmoid router with its load-balancing bias, the softmax
# router of Qwen3-MoE with norm_topk_prob, and the auxiliary-loss-free bias update. (Mixtral's and gpt-oss's router, top-k
# on the logits then a softmax over the chosen, is top_k_gates above.)
#
# Sources: DeepSeek-AI 2024 (the DeepSeek-V3 technical report, §2.1.2: sigmoid affinities, the bias used for the choice
# and not for the gating values, the bias update by ±γ); DeepSeek-V3's inference code (inference/model.py, Gate: a group
# scored by the sum of its two largest biased scores, the chosen affinities normalised and multiplied by route_scale, the
# config's routed_scaling_factor 2.5); Wang et al. 2024 (arXiv 2408.15664, Algorithm 1: b_i += u·sign(mean load - load_i));
# transformers 5.24 (DeepseekV3TopkRouter, Qwen3MoeTopKRouter), whose routing these functions equal.
# Extra letters: G expert groups (E divisible by G, at least two experts in each), G_k groups kept per token.
# ---------------------------------------------------------------------------


def group_scores(choice_scores, n_group):
    """(N, E) -> (N, G): each group of E/G consecutive experts scored by the sum of its two largest choice scores."""
    N, E = choice_scores.shape
    grouped = choice_scores.reshape(N, n_group, E // n_group)  # (N, G, E/G)
    return -np.sort(-grouped, axis=-1)[..., :2].sum(axis=-1)  # the top two of each group, not its maximum


def grouped_top_k_indices(router_logits, bias, k, n_group, topk_group):
    """The k experts DeepSeek-V3 routes each token to, (N, E) -> (N, k), best first, ties to the lower index: the top k of the
    biased affinities σ(r) + b among the experts of the token's topk_group best groups."""
    N, E = router_logits.shape
    choice = sigmoid(router_logits) + bias  # (N, E): the bias steers the choice, never the gates
    kept = np.zeros((N, n_group), dtype=bool)
    np.put_along_axis(kept, top_k_indices(group_scores(choice, n_group), topk_group), True, axis=-1)  # (N, G)
    in_kept_group = np.repeat(kept, E // n_group, axis=-1)  # (N, E)
    return top_k_indices(np.where(in_kept_group, choice, -np.inf), k)  # an expert of a dropped group is never chosen


def grouped_top_k_gates(router_logits, bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    """DeepSeek-V3's router: (N, E) logits and the (E,) balancing bias -> (N, E) gates, 0 for the experts not chosen.

    The chosen experts (grouped_top_k_indices) are gated by their affinities σ(r) without the bias, divided by their sum
    where norm_topk_prob, then multiplied by routed_scaling_factor: the gates sum to routed_scaling_factor where normalised.
    """
    top = grouped_top_k_indices(router_logits, bias, k, n_group, topk_group)  # (N, k)
    weights = np.take_along_axis(sigmoid(router_logits), top, axis=-1)  # (N, k): the affinities, not the biased scores
    if norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    gates = np.zeros_like(router_logits)
    np.put_along_axis(gates, top, weights * routed_scaling_factor, axis=-1)
    return gates


def softmax_top_k_gates(router_logits, k, norm_topk_prob):
    """Qwen3-MoE's router (and Qwen2-MoE's, OLMoE's): a softmax over all E experts, the k largest kept, divided by their sum
    where norm_topk_prob (then it is top_k_gates), 0 elsewhere. (N, E) -> (N, E)."""
    top = top_k_indices(router_logits, k)  # (N, k): the softmax keeps the logits' order
    probs = np.take_along_axis(softmax(router_logits), top, axis=-1)  # (N, k): probabilities over all E experts
    if norm_topk_prob:
        probs = probs / probs.sum(axis=-1, keepdims=True)
    gates = np.zeros_like(router_logits)
    np.put_along_axis(gates, top, probs, axis=-1)
    return gates


def expert_bias_update(bias, tokens_per_expert, rate):
    """The auxiliary-loss-free update of the balancing bias (E,): down by `rate` for an expert that got more than the mean
    load, up by `rate` for one that got less, unchanged at the mean."""
    counts = np.asarray(tokens_per_expert, dtype=np.int64)  # (E,)
    direction = np.sign(counts.sum() - counts * counts.size)  # sign(mean - load), compared exactly in integers
    return bias + direction.astype(bias.dtype) * rate


# ---------------------------------------------------------------------------
# Multi-head latent attention (protocol v2): DeepSeek-V2's MLA, as in DeepSeek-V3 and Kimi K2. Keys and values are
# up-projected from one shared latent per token; a decoupled RoPE key, one for all heads, carries the position; the cache
# holds the latent and that key only.
#
# Sources: DeepSeek-AI 2024 (DeepSeek-V2, arXiv 2405.04434, §2.1.2-2.1.3: the low-rank compression of keys, values and
# queries, the decoupled RoPE query and shared key, the cache of d_c + d_h^R numbers per token, the absorption of W^UK into
# W^UQ and of W^UV into W^O); DeepSeek-V3's inference code (inference/model.py, MLA: the RMSNorms q_norm and kv_norm on
# the latents, softmax_scale = qk_head_dim^-0.5 · mscale², RoPE on interleaved pairs (2i, 2i + 1) through view_as_complex,
# the "absorb" path that caches kv_norm(latent) and the rotated k_pe); transformers 5.24 (DeepseekV3Attention:
# q_a_layernorm, kv_a_layernorm, yarn_apply_mscale, rope_interleave), whose attention these functions equal.
# Extra letters: r_q and r_kv the query and key-value latent widths (q_lora_rank, kv_lora_rank), D_n the head width without
# position (qk_nope_head_dim), D_r the RoPE width (qk_rope_head_dim, even), D_v the value head width (v_head_dim).
# params: W_q (d, H·(D_n + D_r)) where there is no query compression (DeepSeek-V2-Lite), else W_dq (d, r_q), q_norm (r_q,)
# and W_uq (r_q, H·(D_n + D_r)); W_dkv (d, r_kv), kv_norm (r_kv,), W_kr (d, D_r), W_uk (r_kv, H·D_n), W_uv (r_kv, H·D_v),
# W_o (H·D_v, d). Each head's query columns are its D_n position-free features, then its D_r rotated ones.
# ---------------------------------------------------------------------------


def mla_widths(params, n_heads):
    """(D_n, D_r, D_v): the head widths MLA's params hold."""
    return params["W_uk"].shape[1] // n_heads, params["W_kr"].shape[1], params["W_uv"].shape[1] // n_heads


def mla_softmax_scale(qk_nope_head_dim, qk_rope_head_dim, mscale):
    """mscale²/√(D_n + D_r): the scale of a score over the whole query head, times YaRN's attention factor squared (1 without YaRN)."""
    return mscale * mscale / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)


def mla_query(x, p, n_heads, positions, rope_base, *, pairing="half_split", eps=EPS):
    """The queries (B, H, T, D_n + D_r): each head's position-free features, then its D_r features rotated at `positions`."""
    q = x @ p["W_q"] if "W_q" in p else rms_norm(x @ p["W_dq"], p["q_norm"], eps) @ p["W_uq"]  # (B, T, H·(D_n + D_r))
    q = split_heads(q, n_heads)  # (B, H, T, D_n + D_r)
    D_r = p["W_kr"].shape[1]
    return np.concatenate([q[..., :-D_r], rope(q[..., -D_r:], positions, rope_base, pairing=pairing)], axis=-1)


def mla_latent(x, p, positions, rope_base, *, pairing="half_split", eps=EPS):
    """What MLA caches for each token, (B, T, r_kv + D_r): the normalised latent RMSNorm(x·W_dkv), then the RoPE key rotated at
    `positions`, one for every head. Its width does not depend on the number of heads."""
    latent = rms_norm(x @ p["W_dkv"], p["kv_norm"], eps)  # (B, T, r_kv)
    k_rope = rope(x @ p["W_kr"], positions, rope_base, pairing=pairing)  # (B, T, D_r)
    return np.concatenate([latent, k_rope], axis=-1)


def mla_attention(x, params, n_heads, positions, rope_base=ROPE_BASE, mscale=1.0, *, pairing="half_split", eps=EPS):
    """Causal multi-head latent attention, the naive way: keys and values up-projected per head. -> out (B, T, d), weights (B, H, T, T).

    Head h's key is [latent·W_uk_h, k_rope] (the RoPE key shared by every head), its value latent·W_uv_h; the scores are
    scaled by mscale²/√(D_n + D_r). x (B, T, d) sits at `positions` (T,) int; causal by index.
    """
    p = params
    D_n, D_r, _ = mla_widths(p, n_heads)
    q = mla_query(x, p, n_heads, positions, rope_base, pairing=pairing, eps=eps)  # (B, H, T, D_n + D_r)
    cache = mla_latent(x, p, positions, rope_base, pairing=pairing, eps=eps)  # (B, T, r_kv + D_r)
    latent, k_rope = cache[..., :-D_r], cache[..., -D_r:]
    k_nope = split_heads(latent @ p["W_uk"], n_heads)  # (B, H, T, D_n)
    k = np.concatenate([k_nope, np.broadcast_to(k_rope[:, None], (*k_nope.shape[:-1], D_r))], axis=-1)  # (B, H, T, D_n + D_r)
    v = split_heads(latent @ p["W_uv"], n_heads)  # (B, H, T, D_v)
    T = x.shape[1]
    scores = q @ k.swapaxes(-1, -2) * mla_softmax_scale(D_n, D_r, mscale)  # (B, H, T, T)
    weights = masked_softmax(scores, np.broadcast_to(visible_keys(T, T), scores.shape))
    return merge_heads(weights @ v) @ p["W_o"], weights  # (B, T, H·D_v) x (H·D_v, d) -> (B, T, d)


def mla_absorbed(q, cache, p, n_heads, mscale):
    """Attention of the last T of S cached tokens, absorbed: W_uk folded into the queries, W_uv applied after the weights, so no
    per-head key or value is ever formed. q (B, H, T, D_n + D_r), cache (B, S, r_kv + D_r) -> (B, H, T, D_v)."""
    D_n, D_r, D_v = mla_widths(p, n_heads)
    r_kv = p["W_uk"].shape[0]
    W_uk = p["W_uk"].reshape(r_kv, n_heads, D_n)  # (r_kv, H, D_n)
    W_uv = p["W_uv"].reshape(r_kv, n_heads, D_v)  # (r_kv, H, D_v)
    latent, k_rope = cache[:, None, :, :-D_r], cache[:, None, :, -D_r:]  # (B, 1, S, r_kv), (B, 1, S, D_r)
    q_latent = np.einsum("bhtn,rhn->bhtr", q[..., :D_n], W_uk)  # (B, H, T, r_kv): q_nope·W_uk_hᵀ
    scores = (q_latent @ latent.swapaxes(-1, -2) + q[..., D_n:] @ k_rope.swapaxes(-1, -2)) * mla_softmax_scale(D_n, D_r, mscale)
    T, S = q.shape[2], cache.shape[1]
    weights = masked_softmax(scores, np.broadcast_to(visible_keys(T, S), scores.shape))  # (B, H, T, S)
    return np.einsum("bhtr,rhv->bhtv", weights @ latent, W_uv)  # (B, H, T, r_kv) -> (B, H, T, D_v)


def mla_decode(x, params, n_heads, positions, rope_base=ROPE_BASE, mscale=1.0, chunks=None, *, pairing="half_split", eps=EPS):
    """MLA over x (B, T, d) in chunks, each attending to the cache of the tokens before it and itself, absorbed.
    -> (out (B, T, d), the cache (B, T, r_kv + D_r): mla_latent of every token, in order).

    chunks: positive ints summing to T (None: one chunk). Each chunk's tokens sit at their own `positions`.
    """
    T = x.shape[1]
    chunks = [T] if chunks is None else [int(n) for n in np.asarray(chunks).reshape(-1)]
    if any(n < 1 for n in chunks) or sum(chunks) != T:
        raise ValueError(f"chunks {chunks} must be positive and sum to the sequence length {T}")
    positions = np.asarray(positions)
    outs, cached, start = [], [], 0
    for n in chunks:
        new, at = x[:, start : start + n], positions[start : start + n]
        cached.append(mla_latent(new, params, at, rope_base, pairing=pairing, eps=eps))  # (B, n, r_kv + D_r): appended, never recomputed
        cache = np.concatenate(cached, axis=1)  # (B, start + n, r_kv + D_r)
        q = mla_query(new, params, n_heads, at, rope_base, pairing=pairing, eps=eps)  # (B, H, n, D_n + D_r)
        outs.append(merge_heads(mla_absorbed(q, cache, params, n_heads, mscale)) @ params["W_o"])  # (B, n, d)
        start += n
    return np.concatenate(outs, axis=1), cache


# ---------------------------------------------------------------------------
# RoPE scaling and partial rotary (protocol v2): the inverse frequencies and the attention factor of a scaled RoPE at a
# sequence length (linear, dynamic NTK, Llama 3.1's llama3, YaRN, LongRoPE), the softmax scale DeepSeek folds YaRN's mscale
# into, and RoPE on the first part of each head only.
#
# Sources: Chen et al. 2023 (arXiv 2306.15595, position interpolation: positions / s); the dynamic NTK rule of
# /u/bloc97 and /u/emozilla (base · (s·L/L_0 − (s − 1))^(d/(d−2)) past the trained length L_0); Meta's llama-models
# (models/llama3_1/api/model.py, apply_scaling: the low, high and smoothed bands); Peng et al. 2023 (arXiv 2309.00071,
# YaRN §3.2, eq. 25 and the ramp γ between β_fast and β_slow rotations, √(1/t) = 0.1·ln s + 1) and jquesnelle/yarn's
# code; DeepSeek-V2/V3's modeling_deepseek.py (attention factor mscale/mscale_all_dim on cos and sin, mscale_all_dim² on
# the softmax scale); Ding et al. 2024 (arXiv 2402.13753, LongRoPE) and Phi-3's modeling_phi3.py (short factors up to the
# trained length, long ones past it, √(1 + ln s / ln L_0)); GPT-NeoX's rotary_pct and transformers' partial_rotary_factor
# (int(D·factor) rotated, with frequencies over that width). transformers 5.24's modeling_rope_utils.py
# (ROPE_INIT_FUNCTIONS) computes the same, in float32.
# Extra letters: d the rotated width (head_dim, or int(head_dim · partial_rotary_factor)), L_0 the trained length
# (original_max_position_embeddings), s the scaling factor.
# ---------------------------------------------------------------------------

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")  # transformers' rope_type names


def inverse_frequencies(d, base):
    """(d/2,) θ_i = base^(-2i/d), float64: RoPE's unscaled inverse frequencies."""
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def yarn_mscale(factor, mscale=1.0):
    """YaRN's magnitude 0.1·mscale·ln s + 1 (1 for s <= 1): √(1/t) of the paper, DeepSeek's yarn_get_mscale."""
    return 1.0 if factor <= 1 else 0.1 * mscale * float(np.log(factor)) + 1.0


def yarn_correction_range(d, base, beta_fast, beta_slow, original, truncate=True):
    """(low, high): the pair indices where β_fast and β_slow full rotations fit in the trained length L_0 (floor and ceil
    where truncate), clipped to [0, d − 1]; pairs up to low keep θ_i, pairs from high on are divided by s."""

    def pair_index(rotations):
        return d * np.log(original / (rotations * 2 * np.pi)) / (2 * np.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = np.floor(low), np.ceil(high)
    return max(float(low), 0.0), min(float(high), d - 1.0)


def yarn_ramp(d, low, high):
    """(d/2,) γ_i: 0 for pairs up to low (kept), 1 from high on (interpolated), linear between (HF: 1 − the extrapolation factor)."""
    high = high + 0.001 if low == high else high  # no division by zero
    return np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)


def _linear_frequencies(d, base, scaling, seq_len):
    return inverse_frequencies(d, base) / scaling["factor"], 1.0  # θ/s: the angle of position p/s


def _dynamic_frequencies(d, base, scaling, seq_len):
    s, original = scaling["factor"], scaling["original_max_position_embeddings"]
    length = max(seq_len, original)  # no change up to the trained length
    return inverse_frequencies(d, base * (s * length / original - (s - 1)) ** (d / (d - 2))), 1.0


def _llama3_frequencies(d, base, scaling, seq_len):
    s, original = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    theta = inverse_frequencies(d, base)
    wavelength = 2 * np.pi / theta
    smooth = (original / wavelength - low) / (high - low)  # 0 at the low band's edge L_0/low, 1 at the high band's L_0/high
    scaled = np.where(wavelength > original / low, theta / s, theta)  # the low frequencies divided by s, the high ones kept
    in_band = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(in_band, (1 - smooth) * theta / s + smooth * theta, scaled), 1.0


def _yarn_frequencies(d, base, scaling, seq_len):
    s = scaling["factor"]
    low, high = yarn_correction_range(d, base, scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1,
                                      scaling["original_max_position_embeddings"], scaling.get("truncate", True))
    ramp = yarn_ramp(d, low, high)  # (d/2,)
    theta = inverse_frequencies(d, base)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    factor = yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim) if mscale and mscale_all_dim else yarn_mscale(s)
    return theta / s * ramp + theta * (1 - ramp), factor


def _longrope_frequencies(d, base, scaling, seq_len):
    original = scaling["original_max_position_embeddings"]
    chosen = scaling["long_factor"] if seq_len > original else scaling["short_factor"]  # long factors past L_0 only
    s = scaling["max_position_embeddings"] / original
    factor = 1.0 if s <= 1 else float(np.sqrt(1 + np.log(s) / np.log(original)))
    return inverse_frequencies(d, base) / np.asarray(chosen, dtype=np.float64), factor


def rope_frequencies(d_head, base, scaling, seq_len):
    """(inv_freq (d/2,), attention_factor) of a scaled RoPE for sequences of seq_len positions (transformers' ROPE_INIT_FUNCTIONS).

    scaling: {"rope_type": one of ROPE_TYPES, and that type's settings under transformers' names}; the attention factor
    multiplies cos and sin (so each score by its square). Only dynamic and longrope read seq_len.
    """
    kind = scaling["rope_type"]
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type={kind!r} is not one of {', '.join(ROPE_TYPES)}")
    if kind == "default":
        return inverse_frequencies(d_head, base), 1.0
    scaled = {"linear": _linear_frequencies, "dynamic": _dynamic_frequencies, "llama3": _llama3_frequencies,
              "yarn": _yarn_frequencies, "longrope": _longrope_frequencies}[kind]
    return scaled(d_head, base, scaling, seq_len)


def softmax_scale(d_head, scaling):
    """The scale of q·kᵀ: 1/√d_head, times yarn_mscale(s, mscale_all_dim)² where a YaRN config sets mscale_all_dim (DeepSeek-V2/V3)."""
    scale = d_head**-0.5
    if scaling["rope_type"] == "yarn" and scaling.get("mscale_all_dim"):
        scale = scale * yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
    return scale


def rotary_width(D, partial_rotary_factor):
    """How many leading features of a head of width D turn: int(D · partial_rotary_factor) (transformers, GPT-NeoX's rotary_ndims)."""
    return int(D * partial_rotary_factor)


def partial_rope(x, positions, base, partial_rotary_factor, *, pairing="half_split"):
    """RoPE on the first rotary_width(D, factor) features of each head, with frequencies over that width; the rest passes
    through untouched. (..., T, D) -> (..., T, D)."""
    rotary = rotary_width(x.shape[-1], partial_rotary_factor)
    return np.concatenate([rope(x[..., :rotary], positions, base, pairing=pairing), x[..., rotary:]], axis=-1)


# ---------------------------------------------------------------------------
# Attention scores as shipped: ALiBi (BLOOM, MPT, Baichuan), softcapping (Gemma 2, Grok), attention sinks (gpt-oss)
# ---------------------------------------------------------------------------


def alibi_slopes(n_heads):
    """ALiBi's head slopes (H,) float64 (Press et al. 2022, §3; BLOOM's build_alibi_tensor): for H a power of two the geometric
    sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8); otherwise the slopes of the largest power of two P < H, then every other slope
    of 2P (its 1st, 3rd, ...) for the remaining H - P heads."""
    closest = 2 ** int(math.floor(math.log2(n_heads)))  # P
    slopes = 2.0 ** (-8.0 * np.arange(1, closest + 1) / closest)  # (P,)
    extra = 2.0 ** (-4.0 * (2 * np.arange(n_heads - closest) + 1) / closest)  # 2P's slopes 1, 3, 5, ...: 2^(-8·i/(2P))
    return np.concatenate([slopes, extra])


def scores_and_visible(q, k, v, causal, key_mask, window):
    """q·kᵀ/√D (B, H, T, S), where each query may look (B, H, T, S) and the values (B, H, S, D) of gqa_attention's call."""
    H, T, D = q.shape[1:]
    S = k.shape[2]
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])  # (B, H, S, D)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(D)  # (B, H, T, S)
    visible = visible_keys(T, S, causal, window)[None, None]  # (1, 1, T, S)
    if key_mask is not None:
        visible = visible & np.asarray(key_mask, dtype=bool)[:, None, None, :]
    return scores, np.broadcast_to(visible, scores.shape), v


def alibi_attention(q, k, v, slopes, key_mask, *, fully_masked="zeros"):
    """Causal grouped-query attention with ALiBi: head h adds -slopes[h]·(S - T + i - j) to query i's score of key j (its distance
    back, the query at position S - T + i), after the 1/√D scaling; no rotary. (B, H, T, D) -> out (B, H, T, D), weights (B, H, T, S)."""
    T, S = q.shape[2], k.shape[2]
    scores, visible, v = scores_and_visible(q, k, v, True, key_mask, None)
    distance = (np.arange(S - T, S)[:, None] - np.arange(S)[None, :]).astype(q.dtype)  # (T, S), in q's dtype (int64 would promote)
    weights = masked_softmax(scores - np.asarray(slopes, dtype=q.dtype)[:, None, None] * distance, visible, fully_masked=fully_masked)
    return weights @ v, weights


def softcap(x, cap):
    """cap·tanh(x / cap): x itself to first order, never beyond ±cap (Gemma 2's attention and final-logit softcapping)."""
    return cap * np.tanh(x / cap)


def softcapped_attention(q, k, v, causal, key_mask, window, cap, *, fully_masked="zeros"):
    """gqa_attention with the scaled scores softcapped, cap·tanh(s / cap), before the mask (Gemma 2's attn_logit_softcapping):
    a masked key gets weight 0 exactly, never e^(-cap)."""
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    weights = masked_softmax(softcap(scores, cap), visible, fully_masked=fully_masked)
    return weights @ v, weights


def sink_attention(q, k, v, causal, key_mask, window, sinks):
    """gqa_attention with gpt-oss's attention sinks: head h's learned logit sinks[h] joins every row's softmax as one more
    column, which is then dropped, so a row's weights sum to 1 - its sink's share (0 in a row that sees no key)."""
    scores, visible, v = scores_and_visible(q, k, v, causal, key_mask, window)
    sink = np.broadcast_to(np.asarray(sinks)[:, None, None], scores.shape[:-1] + (1,))  # (B, H, T, 1)
    seen = np.concatenate([visible, np.ones_like(visible[..., :1])], axis=-1)  # the sink is always seen
    weights = masked_softmax(np.concatenate([scores, sink], axis=-1), seen)[..., :-1]  # (B, H, T, S): the sink's column dropped
    return weights @ v, weights


# ---------------------------------------------------------------------------
# Gemma's details (protocol v2): GeGLU with the tanh GELU, the scaled embedding, RMSNorm's (1 + w) in float32
# ---------------------------------------------------------------------------
# Sources: Gemma Team 2024 (Gemma §2: GeGLU, the embedding scaled by √d_model, RMSNorm); transformers' modeling_gemma3.py
# (Gemma3MLP with gelu_pytorch_tanh, Gemma3TextScaledWordEmbedding, Gemma3RMSNorm), as huggingface/transformers#29402 aligned
# them with Google's code (google/gemma_pytorch#67 did the same there).


def geglu(x, W_gate, W_up, W_down):
    """GeGLU feed-forward: (GELU(x·W_gate) ⊙ x·W_up)·W_down with the tanh GELU (Gemma's gelu_pytorch_tanh). (..., d) -> (..., d)."""
    return (gelu(x @ W_gate) * (x @ W_up)) @ W_down  # (..., F) ⊙ (..., F) -> (..., F) x (F, d) -> (..., d)


def scaled_embedding(ids, table):
    """Gemma's embedding: the rows table[ids] times √d rounded to the table's dtype (55.5 for d = 3072 in bfloat16, not 55.43).

    (...) int, (V, d) -> (..., d).
    """
    normaliser = np.asarray(math.sqrt(table.shape[-1]), dtype=table.dtype)  # rounded to the dtype first, as Gemma does
    return table[ids] * normaliser


def gemma_rms_norm(x, w, eps):
    """Gemma's RMSNorm: x / √(mean(x²) + eps) · (1 + w), computed in float32 at least and rounded back to x's dtype once.

    (..., d), (d,) -> (..., d). Llama rounds the normalised x to its dtype before the gain; Gemma multiplies by (1 + w) first.
    """
    work = _statistics_dtype(x)  # 16-bit inputs upcast
    y = x.astype(work)
    return (y / np.sqrt((y * y).mean(axis=-1, keepdims=True) + eps) * (1 + w.astype(work))).astype(x.dtype)


# ---------------------------------------------------------------------------
# Per-layer attention types (protocol v2): local (sliding-window) and global (full) layers in one model, each type with its
# own RoPE base, read from a config's layer_types.
#
# Sources: Gemma Team 2024 (Gemma 2 §2: local sliding-window attention of 4096 tokens and global attention alternating, one
# layer in two) and 2025 (Gemma 3 §2.2: five local layers to one global, window 1024, RoPE base 10k on local layers and 1M on
# global ones); OpenAI 2025 (the gpt-oss model card: banded-window layers of 128 tokens alternating with full ones); Qwen2's
# configuration (the first max_window_layers layers full, the rest sliding where use_sliding_window); transformers 5.24,
# whose configs spell every one as layer_types, a list of "sliding_attention" / "full_attention", and whose Gemma 3 keys
# rope_parameters by those names.
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
    logits, _ = hybrid_decode(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases, [np.shape(ids)[1]], pairing=pairing, eps=eps)
    return logits


# ---------------------------------------------------------------------------
# StreamingLLM (protocol v2): a rolling KV cache of cache_size slots that keeps the first n_sink tokens (the attention sinks)
# and the last cache_size - n_sink, RoPE at the positions within the cache.
#
# Sources: Xiao et al. 2023 (Efficient Streaming Language Models with Attention Sinks, arXiv 2309.17453, §3.2: "StreamingLLM
# focuses on positions within the cache rather than those in the original text": a cache holding tokens [0, 1, 2, 3, 6, 7, 8]
# decoding token 9 gives them positions 0 .. 7; keys are cached before RoPE and rotated at each step); the authors' code
# (mit-han-lab/streaming-llm: StartRecentKVCache, pos_shift's key positions arange(kv_seq_len)); transformers' SinkCache
# (4.36 to 4.52, window_length slots sinks included, cached keys re-rotated by the shift), llama.cpp's --keep with its K-shift.
# Extra letters: S the sinks (n_sink), W the cache's slots (cache_size), 0 <= S < W.
# ---------------------------------------------------------------------------


def streaming_held(t, n_sink, cache_size):
    """The tokens a streaming cache holds once token t is in, in slot order: the first n_sink, then the last cache_size - n_sink
    (every token 0 .. t while t < cache_size). Query t sees exactly these."""
    recent = range(max(n_sink, t + 1 - (cache_size - n_sink)), t + 1)  # the window, t itself included
    return [*range(min(n_sink, t + 1)), *recent]


def streaming_attention(q, k, v, n_sink, cache_size, rope_base=ROPE_BASE, *, pairing="half_split"):
    """Causal GQA of a stream through StreamingLLM's cache: query t attends the keys streaming_held(t) with RoPE at the positions
    within the cache, 0 .. m - 1 for its m keys and m - 1 for itself. q (B, H, T, D), k and v (B, H_kv, T, D), un-rotated ->
    out (B, H, T, D), weights (B, H, T, T) (0 for the keys the cache no longer holds)."""
    B, H, T, D = q.shape
    out, weights = np.zeros_like(q), np.zeros((B, H, T, T), dtype=q.dtype)
    for t in range(T):
        held = streaming_held(t, n_sink, cache_size)
        m = len(held)
        query = rope(q[:, :, t:t + 1], [m - 1], rope_base, pairing=pairing)  # (B, H, 1, D): the query in the cache's last slot
        keys = rope(k[:, :, held], np.arange(m), rope_base, pairing=pairing)  # (B, H_kv, m, D): re-rotated to slots 0 .. m - 1
        out[:, :, t:t + 1], weights[:, :, t:t + 1, held] = gqa_attention(query, keys, v[:, :, held], False)
    return out, weights


def streaming_decode(q, k, v, n_sink, cache_size, rope_base=ROPE_BASE, *, pairing="half_split"):
    """What decoding the stream token by token through the cache answers: (out (B, H, T, D), held (T, cache_size) int). out is
    streaming_attention's (each of its queries attends what the cache holds at its step); held[t] the tokens in the slots once
    token t is in, -1 for an empty slot."""
    T = q.shape[2]
    held = np.full((T, cache_size), -1, dtype=np.int64)
    for t in range(T):
        tokens = streaming_held(t, n_sink, cache_size)
        held[t, :len(tokens)] = tokens
    return streaming_attention(q, k, v, n_sink, cache_size, rope_base, pairing=pairing)[0], held
