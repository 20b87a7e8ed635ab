"""The adapter: the course's protocol functions, answered with my classes.

The gate calls these with explicit weights; each call builds the layer from them and runs it.
"""

import numpy as np
from layers import Block, FeedForward, LayerNorm, MultiHeadAttention, RMSNorm, cross_entropy, gelu, softmax
from model import TinyGPT, count_params
from moe import MoE, Router, moe_params
from tokenizer import CharTokenizer
from tokenizer import get_batch as windows


class Adapter:
    BACKEND = "numpy"

    softmax = staticmethod(softmax)
    gelu = staticmethod(gelu)
    cross_entropy = staticmethod(cross_entropy)

    def layer_norm(self, x, gain, bias, eps):
        return LayerNorm(gain, bias, eps)(x)

    def rms_norm(self, x, gain, eps):
        return RMSNorm(gain, eps)(x)

    def attention(self, x, W_q, W_k, W_v, W_o, n_heads, causal):
        mha = MultiHeadAttention(W_q, W_k, W_v, W_o, n_heads, causal)
        out = mha(x)
        return out, mha.weights

    def feed_forward(self, x, W1, b1, W2, b2):
        return FeedForward(W1, b1, W2, b2)(x)

    def transformer_block(self, x, params, n_heads, causal):
        return Block(params, n_heads, causal)(x)

    def gpt_logits(self, ids, params, n_heads):
        return TinyGPT(params, n_heads)(ids)

    def gpt_param_count(self, vocab, d_model, n_layers, max_len, attn_bias):
        return count_params(vocab, d_model, n_layers, max_len, attn_bias)

    def top_k_gates(self, router_logits, k):
        return Router(k).gates(router_logits)

    def tokens_per_expert(self, router_logits, k):
        return Router(k).counts(router_logits)

    def load_balancing_loss(self, router_logits, k):
        return Router(k).balance_loss(router_logits)

    def moe(self, x, router, experts, k):
        return MoE(router, experts, k)(x)

    def moe_n_params(self, d_model, n_experts):
        return moe_params(d_model, n_experts)

    def moe_active_params(self, d_model, n_experts, k):
        return moe_params(d_model, n_experts, k)

    def inference_flops_per_token(self, n_params):
        return 2 * n_params

    def training_flops(self, n_params, n_tokens):
        return 6 * n_params * n_tokens

    def build_vocab(self, text):
        return "".join(CharTokenizer(text).vocab)

    def encode(self, text, vocab):
        return CharTokenizer.from_vocab(vocab).encode(text)

    def decode(self, ids, vocab):
        return CharTokenizer.from_vocab(vocab).decode(ids)

    def get_batch(self, data, batch_size, seq_len, seed):
        if len(data) < seq_len + 1:
            raise ValueError(f"need at least {seq_len + 1} tokens, got {len(data)}")
        return windows(np.asarray(data), batch_size, seq_len, np.random.default_rng(seed))


ADAPTER = Adapter()
