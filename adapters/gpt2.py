"""transformers' GPT-2 behind the protocol: the block, the language model and its parameter count, and their parts.

Tiny models are built locally from a GPT2Config (no download) and run on the suite's
weights through torch.func.functional_call: nothing is copied, autograd reaches every weight.
The parts come from the same model, so the invariants that compare a block with its
sublayers compare GPT-2 with itself: attention is GPT2Attention, feed_forward GPT2MLP, gelu
its "gelu_new" activation, layer_norm the nn.LayerNorm GPT-2 uses (F.layer_norm), and
cross_entropy transformers' fixed_cross_entropy, the loss GPT2LMHeadModel computes.
Conventions converted:
- GPT-2's Conv1D computes x @ weight + bias with weight (d_in, d_out), the protocol's layout:
  c_attn.weight = [W_q | W_k | W_v] (d, 3d), c_proj.weight = W_o, mlp.c_fc = W1, mlp.c_proj = W2.
- GPT-2 always has attention biases; where the params hold none (b_q, b_k, b_v, b_o), they are 0.
- activation_function "gelu_new" is the tanh GELU; layer_norm_epsilon 1e-5 is the protocol's eps.
- The eager attention is used (GPT-2's own softmax(q·kᵀ/√D + mask) @ v). Masks come from
  transformers' create_causal_mask, as GPT2Model builds them; the block in encoder mode
  (causal=False) gets no mask.
- GPT-2 refuses ids outside the vocabulary and sequences longer than n_positions with an
  IndexError from its embedding tables; the adapter re-raises it as the protocol's ValueError.
- gpt_param_count is sum(p.numel()) over a GPT2LMHeadModel built on the meta device (no
  memory), the tied lm_head counted once; attn_bias=False subtracts the sizes of the model's own
  c_attn and c_proj bias tensors, since GPT-2 cannot drop them.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch.func import functional_call
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.activations import ACT2FN
from transformers.loss.loss_utils import fixed_cross_entropy
from transformers.masking_utils import create_causal_mask
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

BACKEND = "torch"
ATTENTION_BIASES = ("b_q", "b_k", "b_v", "b_o")


def _config(*, vocab=1, d_model, n_layers=1, max_len=1, n_heads=1, inner=None):
    return GPT2Config(
        vocab_size=vocab,
        n_positions=max_len,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        n_inner=inner,  # None: 4·d
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
        bos_token_id=None,  # GPT-2's 50256 is outside a tiny vocabulary, and no token is special here
        eos_token_id=None,
    )


@lru_cache(maxsize=32)
def _block(d_model, n_heads, inner, dtype, device):
    """A GPT2Block of this shape; its own weights are never used (functional_call replaces them)."""
    config = _config(d_model=d_model, n_heads=n_heads, inner=inner)
    return GPT2Block(config, layer_idx=0).to(dtype=dtype, device=device).eval()


@lru_cache(maxsize=32)
def _language_model(vocab, d_model, n_layers, max_len, n_heads, inner, dtype, device):
    config = _config(vocab=vocab, d_model=d_model, n_layers=n_layers, max_len=max_len, n_heads=n_heads, inner=inner)
    return GPT2LMHeadModel(config).to(dtype=dtype, device=device).eval()


def _block_weights(p, prefix=""):
    """The protocol's block params under GPT-2's parameter names (Conv1D: (d_in, d_out), like the protocol)."""
    zeros = torch.zeros_like(p["ln1_b"])
    b_q, b_k, b_v, b_o = (p.get(name, zeros) for name in ATTENTION_BIASES)
    weights = {
        "ln_1.weight": p["ln1_g"],
        "ln_1.bias": p["ln1_b"],
        "attn.c_attn.weight": torch.cat([p["W_q"], p["W_k"], p["W_v"]], dim=1),  # (d, 3d)
        "attn.c_attn.bias": torch.cat([b_q, b_k, b_v]),  # (3d,)
        "attn.c_proj.weight": p["W_o"],
        "attn.c_proj.bias": b_o,
        "ln_2.weight": p["ln2_g"],
        "ln_2.bias": p["ln2_b"],
        "mlp.c_fc.weight": p["W1"],  # (d, F)
        "mlp.c_fc.bias": p["b1"],
        "mlp.c_proj.weight": p["W2"],  # (F, d)
        "mlp.c_proj.bias": p["b2"],
    }
    return {prefix + name: value for name, value in weights.items()}


def _mask(block, x, causal):
    """The (B, 1, T, T) additive mask GPT2Model builds for x, or None (no mask) in encoder mode."""
    if not causal:
        return None
    positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T)
    return create_causal_mask(config=block.attn.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=positions)


def gelu(x):
    """GPT-2's activation, transformers' "gelu_new" (the tanh form)."""
    return ACT2FN["gelu_new"](x)


def layer_norm(x, gain, bias, eps=1e-5):
    """GPT-2's LayerNorm, torch's nn.LayerNorm over the last axis (population variance, eps inside the root)."""
    return torch.nn.functional.layer_norm(x, x.shape[-1:], gain, bias, eps)


def cross_entropy(logits, targets):
    """Mean NLL in nats: transformers' fixed_cross_entropy (GPT2LMHeadModel's loss) on (N, V) logits and (N,) targets."""
    return fixed_cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True):
    """(B, T, d) -> (B, T, d) and weights (B, H, T, T) through GPT2Attention (zero attention biases)."""
    d = x.shape[-1]
    block = _block(d, n_heads, None, x.dtype, x.device)
    zeros = torch.zeros(3 * d, dtype=x.dtype, device=x.device)
    weights = {
        "c_attn.weight": torch.cat([W_q, W_k, W_v], dim=1),  # (d, 3d)
        "c_attn.bias": zeros,
        "c_proj.weight": W_o,
        "c_proj.bias": zeros[:d],
    }
    return functional_call(block.attn, weights, (x,), {"attention_mask": _mask(block, x, causal)})


def feed_forward(x, W1, b1, W2, b2):
    """(..., d) -> (..., d) through GPT2MLP: Conv1D, gelu_new, Conv1D."""
    block = _block(x.shape[-1], 1, W1.shape[1], x.dtype, x.device)
    weights = {"c_fc.weight": W1, "c_fc.bias": b1, "c_proj.weight": W2, "c_proj.bias": b2}
    return functional_call(block.mlp, weights, (x,))


def transformer_block(x, params, n_heads, causal=True):
    """(B, T, d) -> (B, T, d) through transformers' GPT2Block (pre-norm)."""
    block = _block(x.shape[-1], n_heads, params["W1"].shape[1], x.dtype, x.device)
    return functional_call(block, _block_weights(params), (x,), {"attention_mask": _mask(block, x, causal)})


def gpt_logits(ids, params, n_heads):
    """(B, T) ids -> (B, T, V) logits through transformers' GPT2LMHeadModel (lm_head tied to wte)."""
    wte, wpe, blocks = params["wte"], params["wpe"], params["blocks"]
    V, d = wte.shape
    inner = blocks[0]["W1"].shape[1] if blocks else None
    model = _language_model(V, d, len(blocks), wpe.shape[0], n_heads, inner, wte.dtype, wte.device)
    weights = {
        "transformer.wte.weight": wte,
        "lm_head.weight": wte,  # tied: the same tensor
        "transformer.wpe.weight": wpe,
        "transformer.ln_f.weight": params["lnf_g"],
        "transformer.ln_f.bias": params["lnf_b"],
    }
    for i, block in enumerate(blocks):
        weights.update(_block_weights(block, prefix=f"transformer.h.{i}."))
    try:
        return functional_call(model, weights, (), {"input_ids": ids, "use_cache": False}).logits
    except IndexError as exc:  # GPT-2's embedding lookup refusing an id or a position
        raise ValueError(f"GPT-2 refused ids of shape {tuple(ids.shape)} (vocab {V}, n_positions {wpe.shape[0]}): {exc}") from exc


def gpt_param_count(vocab, d_model, n_layers, max_len, attn_bias=True):
    """sum(p.numel()) over a GPT2LMHeadModel of this size, built on the meta device; tied head counted once."""
    with torch.device("meta"):
        model = GPT2LMHeadModel(_config(vocab=vocab, d_model=d_model, n_layers=n_layers, max_len=max_len))
    count = sum(p.numel() for p in model.parameters())  # parameters() yields the tied wte/lm_head tensor once
    if not attn_bias:
        count -= sum(block.attn.c_attn.bias.numel() + block.attn.c_proj.bias.numel() for block in model.transformer.h)
    return count
