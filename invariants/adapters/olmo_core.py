"""allenai/OLMo-core's Llama-like transformer (TransformerConfig.llama_like, its RotaryEmbedding and torch attention backend)
behind rope, swiglu, llama_block, llama_logits and gqa_attention.

    pytest --pyargs invariants --impl invariants.adapters.olmo_core --impl-dtype float32

Its conventions, stated: RoPE pairs (i, i + D/2) (rotate_half: ROPE_PAIRING = "half_split"), its
sin and cos computed in float32 and applied in full precision (COMPUTE_DTYPE = "float32"); a window
of w keys is its SlidingWindowAttentionConfig(pattern=[w]) (window_size (w - 1, 0)). Its RoPE takes a
start offset, not positions (rope: from_zero). No llama_decode: its KV cache (KVCacheManager) runs on
the flash-attention backends only, and its torch backend refuses one. That backend is the attention
core, called alone: causal whatever it is asked, top-left aligned where T < S (SDPA's is_causal, and
a tril mask with a window), no padding mask, no weights.
"""

from olmo_core.nn.attention import SlidingWindowAttentionConfig
from olmo_core.nn.feed_forward import FeedForwardConfig
from olmo_core.nn.rope import RotaryEmbedding
from olmo_core.nn.transformer import TransformerConfig

from invariants.adapters import toolkit as tk

BACKEND = "torch"
ROPE_PAIRING = "half_split"
COMPUTE_DTYPE = "float32"
ATTENTION_WEIGHTS, CAUSAL_ONLY, KEY_MASK, CAUSAL_ALIGNMENT = False, True, False, "top_left"
MLP = {"w1.weight": tk.T("W_gate"), "w3.weight": tk.T("W_up"), "w2.weight": tk.T("W_down")}
ATTN = {"w_q.weight": tk.T("W_q"), "w_k.weight": tk.T("W_k"), "w_v.weight": tk.T("W_v"), "w_out.weight": tk.T("W_o")}
BLOCK = {"attention_norm.weight": "attn_norm", "feed_forward_norm.weight": "ffn_norm"} | tk.under("attention.", ATTN) | tk.under("feed_forward.", MLP)
MODEL = {"embeddings.weight": "embed", "blocks.{}.": tk.each("blocks", BLOCK), "lm_head.norm.weight": "norm", "lm_head.w_out.weight": tk.T("W_out")}


def _olmo(vocab=1, n_layers=1, n_heads=1, n_kv_heads=1, d_model=2, rope_base=10_000.0, d_ff=1, window=None):
    sliding = window and SlidingWindowAttentionConfig([window], force_full_attention_on_first_layer=False, force_full_attention_on_last_layer=False)
    return TransformerConfig.llama_like(d_model=d_model, vocab_size=vocab, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                        rope_theta=rope_base, feed_forward=FeedForwardConfig(d_ff, bias=False), sliding_window=sliding).build()


def gqa_attention(q, k, v, causal, key_mask, window):
    sizes = {"d_model": q.shape[1] * q.shape[3], "n_heads": q.shape[1], "n_kv_heads": k.shape[1], "window": window}
    sdpa = tk.module(_olmo, like=q, part="blocks.0.attention.backend", **sizes)
    return sdpa((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))).transpose(1, 2)  # its (B, T, H, D) layout


rope = tk.rope(lambda x, at, base: RotaryEmbedding(head_size=x.shape[-1], theta=base)(x, x)[0], layout="bhtd", from_zero=True)
swiglu = tk.swiglu(_olmo, MLP, part="blocks.0.feed_forward")
llama_block = tk.llama_block(_olmo, BLOCK, part="blocks.0")
llama_logits = tk.llama_logits(_olmo, MODEL)
