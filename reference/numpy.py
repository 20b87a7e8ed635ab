"""Reference transformer in numpy: every function of the implementation protocol, written to be read.

Sources: Vaswani et al. 2017 (attention, the block), Radford et al. 2019 (GPT-2: pre-norm,
tanh GELU, learned positions, tied output), Hendrycks & Gimpel 2016 (GELU, both forms), Ba et
al. 2016 (LayerNorm), Zhang & Sennrich 2019 (RMSNorm), Fedus, Zoph & Shazeer 2021 (Switch: the
balancing loss), Jiang et al. 2024 (Mixtral: softmax over the kept top-k scores).

The protocol's functions are called positionally; the keyword-only options (gelu_form, eps) are
the suite's: they let the reference follow an implementation's declared conventions
(invariants/conventions.py), e.g. transformer_block(x, params, n_heads, causal, gelu_form="erf").

Dimension letters, used in every shape comment:
    B batch, T sequence, d model width, H heads, D head width (d = H·D),
    F feed-forward width (4·d), V vocabulary, N tokens, E experts.
"""

from __future__ import annotations

import math

import numpy as np

from reference.counts import (  # noqa: F401  (part of this module's protocol surface)
    gpt_param_count,
    inference_flops_per_token,
    moe_active_params,
    moe_n_params,
    training_flops,
)
from reference.text import build_vocab, decode, encode, get_batch  # noqa: F401

__all__ = [
    "BACKEND", "PROTOCOL_VERSION", "GELU_FORM", "ATTENTION_BIASES", "EPS", "GELU_FORMS", "ATTENTION_BIAS_NAMES",
    "softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm", "gelu", "gelu_erf", "gelu_of",
    "attention", "feed_forward", "transformer_block", "gpt_logits", "gpt_param_count",
    "top_k_indices", "top_k_gates", "moe", "tokens_per_expert", "load_balancing_loss",
    "moe_n_params", "moe_active_params", "inference_flops_per_token", "training_flops",
    "build_vocab", "encode", "decode", "get_batch",
]

BACKEND = "numpy"
PROTOCOL_VERSION = 1
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
    shifted = x - x.max(axis=axis, keepdims=True)
    e = np.exp(shifted)  # a masked -inf becomes exactly 0 here
    return e / e.sum(axis=axis, keepdims=True)


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


def layer_norm(x, gain, bias, eps=EPS):
    """Normalise each row (one token's features) to mean 0 and variance 1, then scale and shift.

    The variance is the population one (divide by d, not d - 1), and eps sits inside the
    square root, as in torch.nn.LayerNorm and GPT-2.
    """
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    centred = x - mean  # (..., d)
    var = (centred * centred).mean(axis=-1, keepdims=True)  # (..., 1)
    return centred / np.sqrt(var + eps) * gain + bias


def rms_norm(x, gain, eps=EPS):
    """Divide each row by its root mean square, then scale: LayerNorm without centring or bias."""
    mean_square = (x * x).mean(axis=-1, keepdims=True)  # (..., 1)
    return x / np.sqrt(mean_square + eps) * gain


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


def moe(x, router, experts, k, *, gelu_form="tanh"):
    """Sparse mixture of experts: each token gets the gate-weighted sum of its top-k experts. (N, d) -> (N, d).

    `router` is (d, E); `experts` is a list of E feed-forward params (W1, b1, W2, b2).
    """
    gates = top_k_gates(x @ router, k)  # (N, d) x (d, E) -> (N, E)
    out = np.zeros_like(x)
    for e, expert in enumerate(experts):
        chosen = gates[:, e] > 0  # (N,): an expert runs only on the tokens routed to it
        if chosen.any():
            out[chosen] += gates[chosen, e : e + 1] * feed_forward(x[chosen], **expert, gelu_form=gelu_form)
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
