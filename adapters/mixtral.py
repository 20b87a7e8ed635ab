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

import torch
import torch.nn.functional as F
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

from adapters import toolkit as tk

BACKEND = "torch"
TOP_K_TIES = "any"  # torch.topk's order among tied experts, not the lower index first
BIAS_UNIT_GATE = 32.0  # tanh-GELU(32) = 32 exactly in every dtype (tanh saturates to 1): a constant hidden unit


def _moe_block(d_model, d_ff, n_experts, k):
    config = MixtralConfig(hidden_size=d_model, intermediate_size=d_ff, num_local_experts=n_experts, num_experts_per_tok=k,
                           hidden_act="gelu_pytorch_tanh", router_jitter_noise=0.0)
    config._experts_implementation = "eager"  # the reference loop over experts, not a fused kernel
    return MixtralSparseMoeBlock(config)


def _route(router_logits, k):
    """Mixtral's router on given logits (an identity weight: exact): (N, E) -> kept weights (N, k) (float32) and expert indices (N, k)."""
    E = router_logits.shape[-1]
    router = tk.module(_moe_block, like=router_logits, part="gate", d_model=E, d_ff=1, n_experts=E, k=k)
    return tk.call(router, {"weight": torch.eye(E, dtype=router_logits.dtype, device=router_logits.device)}, router_logits)[1:]


def top_k_gates(router_logits, k):
    """(N, E) -> (N, E): Mixtral's renormalised top-k routing weights, 0 for the experts not chosen."""
    weights, indices = _route(router_logits, k)
    return torch.zeros_like(router_logits).scatter(-1, indices, weights.to(router_logits.dtype))


def tokens_per_expert(router_logits, k):
    """(N, E) -> (E,): how many tokens Mixtral's router sends to each expert."""
    return torch.bincount(_route(router_logits, k)[1].reshape(-1), minlength=router_logits.shape[-1])


def load_balancing_loss(router_logits, k):
    """The Switch loss E·Σ f_i·P_i: transformers' load_balancing_loss_func, which is k times it, divided by k."""
    return load_balancing_loss_func((router_logits,), router_logits.shape[-1], k) / k


def _experts(experts, d):
    """The protocol's GELU experts as Mixtral's gate_up_proj (E, 2(F + 1), d + 1) and down_proj (E, d + 1, F + 1)."""
    unit = experts[0]["W1"].new_full((1, 1), BIAS_UNIT_GATE)
    gates = [torch.block_diag(e["W1"].T, unit) + F.pad(e["b1"][:, None], (d, 0, 0, 1)) for e in experts]  # (F + 1, d + 1): [W1ᵀ b1; 0 32]
    up = F.pad(torch.ones_like(gates[0][:, :1]), (d, 0))  # (F + 1, d + 1): every unit's up projection reads the appended 1
    down = [F.pad(torch.cat([e["W2"].T, e["b2"][:, None] / BIAS_UNIT_GATE], dim=1), (0, 0, 0, 1)) for e in experts]  # (d + 1, F + 1)
    return torch.stack([torch.cat([gate, up]) for gate in gates]), torch.stack(down)


def moe(x, router, experts, k):
    """(N, d) -> (N, d) through MixtralSparseMoeBlock, the protocol's experts written into its weights."""
    d, E, F_ = x.shape[1], router.shape[1], experts[0]["W1"].shape[1]
    block = tk.module(_moe_block, like=x, d_model=d + 1, d_ff=F_ + 1, n_experts=E, k=k)
    gate_up, down = _experts(experts, d)
    values = {"gate.weight": F.pad(router.T, (0, 1)), "experts.gate_up_proj": gate_up, "experts.down_proj": down}  # the router ignores the 1
    return tk.call(block, values, F.pad(x, (0, 1), value=1.0)[None])[0, :, :d]  # (1, N, d + 1) -> (N, d)


def feed_forward(x, W1, b1, W2, b2):
    """(..., d) -> (..., d) as one Mixtral expert: the block with one expert, whose gate is exactly 1."""
    d = x.shape[-1]
    return moe(x.reshape(-1, d), x.new_zeros(d, 1), [{"W1": W1, "b1": b1, "W2": W2, "b2": b2}], 1).reshape(x.shape)
