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

from reference.counts import (  # noqa: F401  (part of this module's protocol surface)
    gpt_param_count,
    inference_flops_per_token,
    moe_active_params,
    moe_n_params,
    training_flops,
)
from reference.numpy import ATTENTION_BIAS_NAMES, EPS, GELU_FORMS, check_token_ids
from reference.text import build_vocab, decode, encode, get_batch  # noqa: F401

__all__ = [
    "BACKEND", "PROTOCOL_VERSION", "GELU_FORM", "ATTENTION_BIASES", "EPS", "GELU_FORMS", "ATTENTION_BIAS_NAMES",
    "softmax", "log_softmax", "cross_entropy", "layer_norm", "rms_norm", "gelu", "gelu_erf", "gelu_of",
    "attention", "feed_forward", "transformer_block", "gpt_logits", "gpt_param_count",
    "top_k_indices", "top_k_gates", "moe", "tokens_per_expert", "load_balancing_loss",
    "moe_n_params", "moe_active_params", "inference_flops_per_token", "training_flops",
    "build_vocab", "encode", "decode", "get_batch",
]

BACKEND = "torch"
PROTOCOL_VERSION = 1
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


@accumulate_in_float32
def softmax(x, axis=-1):
    """exp(x) / Σ exp(x) along `axis`, the row maximum subtracted first."""
    shifted = x - x.amax(dim=axis, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=axis, keepdim=True)


@accumulate_in_float32
def log_softmax(x, axis=-1):
    """x - logsumexp(x) along `axis`."""
    shifted = x - x.amax(dim=axis, keepdim=True)
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


def moe(x, router, experts, k, *, gelu_form="tanh"):
    """Sparse mixture of experts: (N, d) -> (N, d), each token mixing its top-k experts' outputs."""
    gates = top_k_gates(x @ router, k)  # (N, E)
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        chosen = gates[:, e] > 0  # (N,)
        if chosen.any():
            out[chosen] += gates[chosen, e : e + 1] * feed_forward(x[chosen], **expert, gelu_form=gelu_form)
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
