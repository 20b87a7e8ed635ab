"""TransformerLens's HookedTransformer (3.9): GPT-2's architecture, re-implemented for interpretability, behind the protocol.

TransformerLens writes its own einsum attention, LayerNorm, MLP, embeddings and unembedding
with a hook after every step, so this is a second implementation of the GPT-2 block and model,
independent of transformers' code. The parts come from the same classes: attention is its
Attention (the weights captured at its hook_pattern, the softmax output), feed_forward its MLP,
layer_norm its LayerNorm, gelu its gelu_new (the tanh form), transformer_block its
TransformerBlock, gpt_logits HookedTransformer itself.
Conventions converted:
- Weights are per head: W_Q, W_K, W_V (H, d, D) are W_q's column blocks, W_O (H, D, d) W_o's
  row blocks, b_Q, b_K, b_V (H, D); W_in, W_out are the protocol's (d_in, d_out) layout.
- It always has attention biases (ATTENTION_BIASES = True): zeros where the suite drew none.
- Causal or encoder mode is a config field (attention_dir "causal" or "bidirectional"): one
  module is built for each.
- Its unembedding is untied, W_U (d, V) and b_U (V,): the adapter ties it, W_U = wteᵀ, b_U = 0.
- HookedTransformer does not check its input: it reads W_E[ids], so a negative id silently
  picks a row from the end of the table, and W_pos[:T], so with n_ctx = 1 a longer sequence
  broadcasts the one position row over every token (model.refuses_bad_ids finds both). The
  adapter refuses bad ids itself before the call (check_ids=True).
- init_weights=False: the suite's weights replace every parameter anyway.
"""

from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.components import MLP, Attention, LayerNorm, TransformerBlock
from transformer_lens.utilities.activation_functions import gelu_new

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM = "tanh"
ATTENTION_BIASES = True

ATTN = {"W_Q": tk.heads("W_q"), "W_K": tk.heads("W_k"), "W_V": tk.heads("W_v"), "W_O": tk.heads("W_o", rows=True),
        "b_Q": tk.heads("b_q"), "b_K": tk.heads("b_k"), "b_V": tk.heads("b_v"), "b_O": "b_o"}
FFN = {"W_in": "W1", "b_in": "b1", "W_out": "W2", "b_out": "b2"}
BLOCK = tk.norm("ln1", "ln1", weight="w", bias="b") | tk.norm("ln2", "ln2", weight="w", bias="b") | tk.under("attn.", ATTN) | tk.under("mlp.", FFN)
MODEL = {"embed.W_E": "wte", "pos_embed.W_pos": "wpe", "unembed.W_U": tk.T("wte"), "unembed.b_U": tk.zeros("wte"),  # the head tied to wte
         "blocks.{}.": tk.each("blocks", BLOCK)} | tk.norm("ln_final", "lnf", weight="w", bias="b")


def _config(vocab=1, d_model=1, n_layers=1, max_len=1, n_heads=1, d_ff=None, eps=1e-5, causal=True, dtype=None, device=None):
    return HookedTransformerConfig(d_vocab=vocab, d_model=d_model, n_layers=n_layers, n_ctx=max_len, n_heads=n_heads, d_head=d_model // n_heads,
                                   d_mlp=d_ff or 4 * d_model, eps=eps, act_fn="gelu_new", attention_dir="causal" if causal else "bidirectional",
                                   dtype=dtype, device=str(device), init_weights=False)


gelu = gelu_new
layer_norm = tk.layer_norm(lambda **sizes: LayerNorm(_config(**sizes)), layout={"w": "gain", "b": "bias"})
attention = tk.attention(lambda **sizes: Attention(_config(**sizes)), ATTN, lambda attn, x, causal: attn(x, x, x), weights_from="hook_pattern")
feed_forward = tk.feed_forward(lambda **sizes: MLP(_config(**sizes)), FFN)
transformer_block = tk.transformer_block(lambda **sizes: TransformerBlock(_config(**sizes), 0), BLOCK, lambda block, x, causal: block(x))
# tk.quiet: 3.9 warns that 4.0 replaces HookedTransformer by TransformerBridge, a wrapper of transformers' models
gpt_logits = tk.gpt_logits(tk.quiet(lambda **sizes: HookedTransformer(_config(**sizes))), MODEL, lambda model, ids: model(ids), check_ids=True)
