"""transformers' Mixtral sparse MoE block and load_balancing_loss_func behind the protocol's MoE functions.

Mixtral's conventions, and what the adapter does with each:
- Routing: softmax over all E experts (in float32, whatever the input dtype), torch.topk on
  those probabilities, the k kept ones renormalised to sum to 1. That equals the protocol's
  softmax over the kept scores; the gates carry float32 precision, so run this adapter with
  --impl-dtype float32 (or lower): in float64 its float32 routing cannot meet float64 tolerances.
- Ties: torch.topk breaks them its own way, not towards the lower index, hence
  TOP_K_TIES = "any": tied experts may be chosen in any order.
- top_k_gates and tokens_per_expert are read from Mixtral's router (MixtralTopKRouter) fed the
  router logits through an identity weight (exact: each logit times 1 plus zeros): its
  renormalised top-k weights scattered to (N, E), and its chosen indices counted.
- Experts: Mixtral's are SwiGLU without biases, down(act(gate·x) ⊙ up·x); the protocol's are
  GELU networks with biases, W2ᵀ·gelu(W1ᵀx + b1) + b2. The adapter writes the latter into
  Mixtral's own expert weights, so the block's routing, dispatch, expert maths and combine
  all run: x gets a constant 1 appended (h = d + 1), act is the tanh GELU, the up projection
  reads the constant (up·x = 1), b1 is the gate weight on the constant, and one extra hidden
  unit with gate 32 (GELU(32) = 32 exactly) carries b2/32 into the down projection. The router
  weight gets a zero row for the constant, so the router scores are unchanged.
- feed_forward is one Mixtral expert: the block with a single expert, whose gate is exactly 1,
  so the invariants comparing moe with its experts compare Mixtral with itself.
- load_balancing_loss_func normalises the expert counts over the N tokens in each of the k
  slots, so it is exactly k × the Switch loss the protocol defines (counts over N·k slots):
  the adapter divides by k.
moe_n_params and moe_active_params are not provided: they count the protocol's GELU experts,
which Mixtral does not have.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch.func import functional_call
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

BACKEND = "torch"
TOP_K_TIES = "any"  # torch.topk's order among tied experts, not the lower index first
BIAS_UNIT_GATE = 32.0  # tanh-GELU(32) = 32 exactly in every dtype (tanh saturates to 1): a constant hidden unit


@lru_cache(maxsize=32)
def _block(hidden, intermediate, n_experts, k, dtype, device):
    """A MixtralSparseMoeBlock of this shape, eager experts; its own weights are never used (functional_call replaces them)."""
    config = MixtralConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_local_experts=n_experts,
        num_experts_per_tok=k,
        hidden_act="gelu_pytorch_tanh",
        router_jitter_noise=0.0,
    )
    config._experts_implementation = "eager"  # the reference loop over experts, not a fused kernel
    return MixtralSparseMoeBlock(config).to(dtype=dtype, device=device).eval()


def _route(router_logits, k):
    """Mixtral's router on given logits: (N, E) -> kept weights (N, k) (float32) and expert indices (N, k)."""
    N, E = router_logits.shape
    router = _block(E, 1, E, k, router_logits.dtype, router_logits.device).gate
    identity = torch.eye(E, dtype=router_logits.dtype, device=router_logits.device)  # the router's weight: logits pass unchanged
    _, weights, indices = functional_call(router, {"weight": identity}, (router_logits,))
    return weights, indices


def top_k_gates(router_logits, k):
    """(N, E) -> (N, E): Mixtral's renormalised top-k routing weights, 0 for the experts not chosen."""
    weights, indices = _route(router_logits, k)
    return torch.zeros_like(router_logits).scatter(-1, indices, weights.to(router_logits.dtype))


def tokens_per_expert(router_logits, k):
    """(N, E) -> (E,): how many tokens Mixtral's router sends to each expert."""
    _, indices = _route(router_logits, k)
    return torch.bincount(indices.reshape(-1), minlength=router_logits.shape[-1])


def load_balancing_loss(router_logits, k):
    """The Switch loss E·Σ f_i·P_i: transformers' load_balancing_loss_func, which is k times it, divided by k."""
    return load_balancing_loss_func((router_logits,), router_logits.shape[-1], k) / k


def _expert_weights(experts, like):
    """The protocol's GELU experts as Mixtral's gate_up_proj (E, 2I, d + 1) and down_proj (E, d + 1, I), I = F + 1."""
    d, F = experts[0]["W1"].shape
    gate_up, down = [], []
    for e in experts:
        constant = torch.zeros(F + 1, d + 1, dtype=like.dtype, device=like.device)
        constant[:, d] = 1.0  # reads the appended 1
        gate = torch.cat([torch.cat([e["W1"].T, e["b1"][:, None]], dim=1), BIAS_UNIT_GATE * constant[:1]])  # (F + 1, d + 1)
        gate_up.append(torch.cat([gate, constant]))  # (2(F + 1), d + 1): [gate; up], up·x = 1 for every unit
        out = torch.cat([e["W2"].T, e["b2"][:, None] / BIAS_UNIT_GATE], dim=1)  # (d, F + 1)
        down.append(torch.cat([out, torch.zeros_like(out[:1])]))  # (d + 1, F + 1): nothing written to the constant
    return torch.stack(gate_up), torch.stack(down)


def moe(x, router, experts, k):
    """(N, d) -> (N, d) through MixtralSparseMoeBlock, the protocol's experts written into its weights."""
    N, d = x.shape
    E, F = router.shape[1], experts[0]["W1"].shape[1]
    block = _block(d + 1, F + 1, E, k, x.dtype, x.device)
    gate_up, down = _expert_weights(experts, x)
    weights = {
        "gate.weight": torch.cat([router.T, torch.zeros_like(router.T[:, :1])], dim=1),  # (E, d + 1)
        "experts.gate_up_proj": gate_up,
        "experts.down_proj": down,
    }
    extended = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)[None]  # (1, N, d + 1)
    return functional_call(block, weights, (extended,))[0, :, :d]  # (N, d)


def feed_forward(x, W1, b1, W2, b2):
    """(..., d) -> (..., d) as one Mixtral expert: the block with one expert, whose gate is exactly 1."""
    d = x.shape[-1]
    router = torch.zeros(d, 1, dtype=x.dtype, device=x.device)  # (d, 1): one expert, always chosen
    expert = {"W1": W1, "b1": b1, "W2": W2, "b2": b2}
    return moe(x.reshape(-1, d), router, [expert], 1).reshape(x.shape)
