"""transformers' GPT-2 behind the protocol: the block, the language model and its parameter count, and their parts.

Tiny models are built locally from a GPT2Config (no download) and run on the suite's weights
through the toolkit (torch.func.functional_call: nothing copied, autograd reaches every weight).
The parts come from the same model, so the invariants that compare a block with its sublayers
compare GPT-2 with itself: attention is GPT2Attention, feed_forward GPT2MLP, gelu its
"gelu_new" (the tanh form), layer_norm its ln_1 (nn.LayerNorm), cross_entropy transformers'
fixed_cross_entropy, the loss GPT2LMHeadModel computes.
Conventions converted:
- GPT-2's Conv1D computes x @ weight + bias with weight (d_in, d_out), the protocol's layout:
  c_attn.weight = [W_q | W_k | W_v] (d, 3d), c_proj.weight = W_o, mlp.c_fc = W1, mlp.c_proj = W2.
- GPT-2 always has attention biases (ATTENTION_BIASES = True); where the params hold none they are 0.
- The eager attention is used (GPT-2's own softmax(q·kᵀ/√D + mask) @ v, which returns the
  weights). The block and attention alone get an additive causal mask (-inf above the
  diagonal), or none in encoder mode; gpt_logits lets GPT2Model build its own.
- GPT-2 refuses ids outside the vocabulary and sequences longer than n_positions with an
  IndexError from its embedding tables: the toolkit re-raises it as the protocol's ValueError.
- gpt_param_count is sum(numel) over a GPT2LMHeadModel on the meta device, the tied lm_head
  once; attn_bias=False leaves out c_attn's and attn.c_proj's biases, since GPT-2 cannot drop them.
"""

from transformers import GPT2Config, GPT2LMHeadModel
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import fixed_cross_entropy

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM = "tanh"
ATTENTION_BIASES = True

ATTN = {"c_attn.weight": tk.cat("W_q", "W_k", "W_v", dim=1), "c_attn.bias": tk.cat("b_q", "b_k", "b_v"), "c_proj.weight": "W_o", "c_proj.bias": "b_o"}
MLP = {"c_fc.weight": "W1", "c_fc.bias": "b1", "c_proj.weight": "W2", "c_proj.bias": "b2"}
BLOCK = tk.norm("ln_1", "ln1") | tk.norm("ln_2", "ln2") | tk.under("attn.", ATTN) | tk.under("mlp.", MLP)
MODEL = {"transformer.wte.weight": "wte", "lm_head.weight": "wte", "transformer.wpe.weight": "wpe",  # lm_head tied: the same tensor
         "transformer.h.{}.": tk.each("blocks", BLOCK)} | tk.norm("transformer.ln_f", "lnf")


def _gpt2(vocab=1, d_model=1, n_layers=1, max_len=1, n_heads=1, d_ff=None, eps=1e-5):
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=d_model, n_layer=n_layers, n_positions=max_len, n_head=n_heads, n_inner=d_ff,
                                      layer_norm_epsilon=eps, attn_implementation="eager", bos_token_id=None, eos_token_id=None))


def _masked(module, x, causal):  # GPT2Attention and GPT2Block take an additive mask: -inf above the diagonal, or none (encoder mode)
    return module(x, attention_mask=tk.causal_mask(x, causal, additive=True))


gelu = ACT2FN["gelu_new"]
layer_norm = tk.layer_norm(_gpt2, part="transformer.h.0.ln_1")
cross_entropy = tk.cross_entropy(fixed_cross_entropy)
attention = tk.attention(_gpt2, ATTN, _masked, part="transformer.h.0.attn")  # returns (out, weights)
feed_forward = tk.feed_forward(_gpt2, MLP, part="transformer.h.0.mlp")
transformer_block = tk.transformer_block(_gpt2, BLOCK, _masked, part="transformer.h.0")
gpt_logits = tk.gpt_logits(_gpt2, MODEL, lambda model, ids: model(input_ids=ids, use_cache=False).logits)
gpt_param_count = tk.gpt_param_count(_gpt2, without=("attn.c_attn.bias", "attn.c_proj.bias"))
