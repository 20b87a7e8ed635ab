"""Parameter and compute arithmetic of GPT-2-shaped models and the mixture-of-experts layer.

Backend-free: plain integers, shared by the numpy and torch references. The figures match
transformers' GPT-2 counts (tied output counted once) and Kaplan et al. 2020's 2N and 6ND rules.
"""

from __future__ import annotations

GPT2_SIZES = {  # name: (d_model, n_layers); all use vocab 50,257 and max_len 1,024
    "small": (768, 12),
    "medium": (1024, 24),
    "large": (1280, 36),
    "xl": (1600, 48),
}
GPT2_VOCAB, GPT2_MAX_LEN = 50257, 1024


def param_breakdown(vocab, d_model, n_layers, max_len, attn_bias=True):
    """Where a GPT-2-shaped model's parameters live, by part; the values sum to gpt_param_count."""
    d = d_model
    return {
        "embeddings": vocab * d + max_len * d,  # token table (tied with the output) + positions
        "attention": n_layers * (4 * d * d + (4 * d if attn_bias else 0)),  # W_q, W_k, W_v, W_o
        "feed_forward": n_layers * (8 * d * d + 5 * d),  # W1 (d, 4d), b1, W2 (4d, d), b2
        "norms": n_layers * 4 * d + 2 * d,  # two LayerNorms per block, one final
    }


def gpt_param_count(vocab, d_model, n_layers, max_len, attn_bias=True):
    """Exact parameter count of a GPT-2-shaped model with a tied output layer."""
    return sum(param_breakdown(vocab, d_model, n_layers, max_len, attn_bias).values())


def feed_forward_params(d_model, expansion=4):
    """W1, b1, W2, b2 of one d -> expansion·d -> d network: 2·expansion·d² + (expansion + 1)·d."""
    hidden = expansion * d_model
    return 2 * d_model * hidden + hidden + d_model


def moe_n_params(d_model, n_experts):
    """All parameters of a mixture-of-experts layer: the (d, E) router (no bias) and E experts."""
    return d_model * n_experts + n_experts * feed_forward_params(d_model)


def moe_active_params(d_model, n_experts, k):
    """Parameters one token touches: the whole router and its k experts."""
    return d_model * n_experts + k * feed_forward_params(d_model)


def inference_flops_per_token(n_params):
    """About 2·N: one multiply and one add per weight per generated token."""
    return 2 * n_params


def training_flops(n_params, n_tokens):
    """About 6·N·D: the forward pass costs 2·N per token and the backward pass twice that."""
    return 6 * n_params * n_tokens
