"""transformers' Mixtral sparse MoE block and load_balancing_loss_func behind the protocol's MoE functions.

    pytest --pyargs invariants --impl invariants.adapters.mixtral --impl-dtype float32

Mixtral's conventions, and what the adapter does with each:
- Experts: SwiGLU without biases, down(SiLU(gate·x) ⊙ up·x), declared (EXPERT_FFN = "swiglu"): the
  suite then draws experts {W_gate, W_up, W_down} and holds one expert to the protocol's swiglu,
  which here is the block with a single expert (its gate is exactly 1), so the invariants that
  compare moe with its experts compare Mixtral with itself. The protocol's (d, F) weights are
  nn.Linear's (F, d) transposed; gate_up_proj stacks the gate rows over the up rows.
- Routing: softmax over all E experts (in float32, whatever the input dtype), torch.topk on
  those probabilities, the k kept ones renormalised to sum to 1. That equals the protocol's
  softmax over the kept scores; the gates carry float32 precision (COMPUTE_DTYPE = "float32"):
  a float64 run holds the laws held to rounding to float32's (invariants.conventions.rounding_dtype).
- Ties: torch.topk breaks them its own way, not towards the lower index, hence
  TOP_K_TIES = "any": tied experts may be chosen in any order.
- top_k_gates is read from Mixtral's router (MixtralTopKRouter) fed the router logits through an
  identity weight (exact: each logit times 1 plus zeros): its renormalised top-k weights
  scattered to (N, E) at its chosen indices. tokens_per_expert is not provided: counting those
  indices would check the adapter's bincount, not Mixtral.
- load_balancing_loss_func normalises the expert counts over the N tokens in each of the k
  slots, so it is exactly k × the Switch loss the protocol defines (counts over N·k slots):
  the adapter divides by k.
feed_forward (the protocol's GELU network), moe_n_params and moe_active_params are not provided:
Mixtral has no GELU network, and the counts are of GELU experts.
"""

import torch
from transformers.models.mixtral.modeling_mixtral import MixtralConfig, MixtralSparseMoeBlock, load_balancing_loss_func

from invariants.adapters import toolkit as tk

BACKEND = "torch"
EXPERT_FFN, COMPUTE_DTYPE = "swiglu", "float32"
TOP_K_TIES = "any"  # torch.topk's order among tied experts, not the lower index first


def _moe_block(d_model, d_ff, n_experts, k):  # experts_implementation: the library's loop over experts, not a fused kernel
    return MixtralSparseMoeBlock(MixtralConfig(hidden_size=d_model, intermediate_size=d_ff, num_local_experts=n_experts, num_experts_per_tok=k,
                                               hidden_act="silu", router_jitter_noise=0.0, experts_implementation="eager"))


def _route(router_logits, k):
    """Mixtral's router on given logits (an identity weight: exact): (N, E) -> kept weights (N, k) (float32) and expert indices (N, k)."""
    E = router_logits.shape[-1]
    router = tk.module(_moe_block, like=router_logits, part="gate", d_model=E, d_ff=1, n_experts=E, k=k)
    return tk.call(router, {"weight": torch.eye(E).to(router_logits)}, router_logits)[1:]


def top_k_gates(router_logits, k):
    """(N, E) -> (N, E): Mixtral's renormalised top-k routing weights, 0 for the experts not chosen."""
    weights, indices = _route(router_logits, k)
    return torch.zeros_like(router_logits).scatter(-1, indices, weights.to(router_logits.dtype))


def load_balancing_loss(router_logits, k):
    """The Switch loss E·Σ f_i·P_i: transformers' load_balancing_loss_func, which is k times it, divided by k."""
    return load_balancing_loss_func((router_logits,), router_logits.shape[-1], k) / k


def moe(x, router, experts, k):
    """(N, d) -> (N, d) through MixtralSparseMoeBlock with the protocol's router and SwiGLU experts."""
    block = tk.module(_moe_block, like=x, d_model=x.shape[1], d_ff=experts[0]["W_gate"].shape[1], n_experts=router.shape[1], k=k)
    values = {"gate.weight": router.T, "experts.gate_up_proj": torch.stack([torch.cat([e["W_gate"].T, e["W_up"].T]) for e in experts]),
              "experts.down_proj": torch.stack([e["W_down"].T for e in experts])}  # (E, d), (E, 2F, d), (E, d, F)
    return tk.call(block, values, x[None])[0]  # (1, N, d) -> (N, d)


def swiglu(x, W_gate, W_up, W_down):
    """(..., d) -> (..., d) as one Mixtral expert: the block with one expert, whose gate is exactly 1."""
    return moe(x.reshape(-1, x.shape[-1]), x.new_zeros(x.shape[-1], 1), [dict(W_gate=W_gate, W_up=W_up, W_down=W_down)], 1).reshape(x.shape)
