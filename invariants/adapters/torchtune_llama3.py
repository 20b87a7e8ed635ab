"""pytorch/torchtune's Llama 3 (torchtune.models.llama3.llama3, its MultiHeadAttention and KVCache) behind the modern decoder's functions.

    pytest --pyargs invariants --impl invariants.adapters.torchtune_llama3 --impl-dtype float32

Its conventions, stated: RoPE pairs (2i, 2i + 1) (Meta's layout: ROPE_PAIRING = "interleaved");
RMSNorm and RoPE compute in float32 (x.float()) (COMPUTE_DTYPE = "float32"); its logits come back
in float32 whatever the weights' dtype (output(h).float(), for the loss), and are cast back to the
params' dtype here, as the protocol asks; no sliding window (SLIDING_WINDOW = False). Its KVCache is allocated
for the whole sequence and written by its own index (slot p holds position p); the caller gives the
positions and a (B, n, slots) mask, as torchtune's generate does. Its attention core runs on the
suite's q, k and v through the toolkit (no weights, causal only, no padding mask).
"""

from torchtune.models.llama3 import llama3
from torchtune.modules import RotaryPositionalEmbeddings

from invariants.adapters import toolkit as tk

BACKEND = "torch"
ROPE_PAIRING = "interleaved"
COMPUTE_DTYPE = "float32"
SLIDING_WINDOW = False
ATTENTION_WEIGHTS, CAUSAL_ONLY, KEY_MASK = False, True, False
MLP = {"w1.weight": tk.T("W_gate"), "w3.weight": tk.T("W_up"), "w2.weight": tk.T("W_down")}
BLOCK = {"sa_norm.scale": "attn_norm", "attn.q_proj.weight": tk.T("W_q"), "attn.k_proj.weight": tk.T("W_k"), "attn.v_proj.weight": tk.T("W_v"),
         "attn.output_proj.weight": tk.T("W_o"), "mlp_norm.scale": "ffn_norm"} | tk.under("mlp.", MLP)
MODEL = {"tok_embeddings.weight": "embed", "layers.{}.": tk.each("blocks", BLOCK), "norm.scale": "norm", "output.weight": tk.T("W_out")}


def _llama3(vocab=1, n_layers=1, n_heads=1, n_kv_heads=1, d_model=2, max_len=1, rope_base=10_000.0, d_ff=1, batch=None, dtype=None):
    model = llama3(vocab, n_layers, n_heads, n_kv_heads, d_model, max_len, rope_base=rope_base, intermediate_dim=d_ff)
    if batch is not None:  # llama_decode and gqa_attention: its KVCache, allocated for max_len positions
        model.setup_caches(batch, dtype, decoder_max_seq_len=max_len)
    return model


rope = tk.rope(lambda x, at, base: RotaryPositionalEmbeddings(x.shape[-1], int(at.max()) + 1, base).to(x.device)(x, input_pos=at[None]))
swiglu = tk.swiglu(_llama3, MLP, part="layers.0.mlp")
llama_block = tk.llama_block(_llama3, BLOCK, part="layers.0")
llama_logits = tk.llama_logits(_llama3, MODEL, lambda model, ids: model(ids).to(model.norm.scale.dtype))
# decoding as torchtune's generate does: the positions, and a (1, n, slots) mask over its cache's slots, True where a key may be seen
llama_decode = tk.llama_decode(_llama3, MODEL, lambda m, ids, at, visible: m(ids, mask=visible[None], input_pos=at[None]).to(m.norm.scale.dtype),
                               keys=lambda model: [layer.attn.kv_cache.k_cache for layer in model.layers], slots="whole")  # (B, H_kv, S, D)
gqa_attention = tk.gqa_attention(_llama3, lambda attn, x, at, visible: attn(x, x, mask=visible[None], input_pos=at[None]),
                                 q="q_proj", k="k_proj", v="v_proj", out="output_proj", identity=("pos_embeddings",), part="layers.0.attn")
