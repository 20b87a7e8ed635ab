"""transformers' GPT-Neo behind the protocol: the block, the language model, and their parts; a GPT with no encoder mode.

GPT-Neo is GPT-2's architecture written again (EleutherAI): pre-norm blocks of ln_1, attention,
ln_2 and an MLP of c_fc, gelu_new (the tanh form) and c_proj; learned positions, a final ln_f and
a head tied to the token table. The parts come from the same model: attention is
GPTNeoSelfAttention (it returns the weights), feed_forward GPTNeoMLP, layer_norm ln_1.
Conventions converted:
- nn.Linear stores (out, in): q_proj.weight = W_qᵀ, ..., out_proj.weight = W_oᵀ, c_fc = W1ᵀ, c_proj = W2ᵀ.
- **Its scores are not scaled**: softmax(q·kᵀ), trained that way, where the protocol has
  softmax(q·kᵀ/√D). The adapter hands it W_q/√D, the same attention.
- q, k and v have no bias (out_proj has one): ATTENTION_BIASES is left undeclared and b_o is 0.
- Its attention is always causal (a mask buffer of max_position_embeddings, 1,024 for the block
  and attention alone): CAUSAL_ONLY = True. Every layer is "global" (no local window).
- It computes the scores in float32 whatever the input (COMPUTE_DTYPE = "float32"): a float64 run
  holds the laws held to rounding to float32's and the exact ones exactly (invariants.conventions.rounding_dtype).
"""

import math

from transformers import GPTNeoConfig, GPTNeoForCausalLM
from transformers.activations import ACT2FN

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM, CAUSAL_ONLY, COMPUTE_DTYPE = "tanh", True, "float32"


def _unscaled_q(params):  # W_q/√D, transposed to (out, in): GPT-Neo's q·kᵀ is then the protocol's q·kᵀ/√D
    return (params["W_q"] / math.sqrt(params["W_q"].shape[1] // params["n_heads"])).T


ATTN = {"q_proj.weight": _unscaled_q, "k_proj.weight": tk.T("W_k"), "v_proj.weight": tk.T("W_v"), "out_proj.weight": tk.T("W_o"),
        "out_proj.bias": "b_o"}
MLP = {"c_fc.weight": tk.T("W1"), "c_fc.bias": "b1", "c_proj.weight": tk.T("W2"), "c_proj.bias": "b2"}
BLOCK = tk.norm("ln_1", "ln1") | tk.norm("ln_2", "ln2") | tk.under("attn.attention.", ATTN) | tk.under("mlp.", MLP)
MODEL = {"transformer.wte.weight": "wte", "lm_head.weight": "wte", "transformer.wpe.weight": "wpe",  # lm_head tied: the same tensor
         "transformer.h.{}.": tk.each("blocks", BLOCK)} | tk.norm("transformer.ln_f", "lnf")


def _neo(vocab=1, d_model=1, n_layers=1, max_len=1024, n_heads=1, d_ff=None, eps=1e-5):
    return GPTNeoForCausalLM(GPTNeoConfig(vocab_size=vocab, hidden_size=d_model, num_layers=n_layers, attention_types=[[["global"], n_layers]],
                                          max_position_embeddings=max_len, num_heads=n_heads, intermediate_size=d_ff, layer_norm_epsilon=eps,
                                          bos_token_id=None, eos_token_id=None))


gelu = ACT2FN["gelu_new"]  # GPT-Neo's activation_function
layer_norm = tk.layer_norm(_neo, part="transformer.h.0.ln_1")
attention = tk.attention(_neo, ATTN, lambda attn, x, causal: attn(x), part="transformer.h.0.attn.attention")  # (out, weights)
feed_forward = tk.feed_forward(_neo, MLP, part="transformer.h.0.mlp")
transformer_block = tk.transformer_block(_neo, BLOCK, lambda block, x, causal: block(x)[0], part="transformer.h.0")
gpt_logits = tk.gpt_logits(_neo, MODEL, lambda model, ids: model(input_ids=ids, use_cache=False).logits)
