"""The third-party adapters pass chosen invariants (few examples here; the full suite runs in tox -e external)."""

import pytest
from hypothesis import settings

pytest.importorskip("torch", reason="the adapters wrap torch and transformers code; torch is not installed")

from invariants import REGISTRY, all_invariants, load_implementation, run_invariant  # noqa: E402

all_invariants()
FEW = settings(max_examples=8, derandomize=True, database=None, deadline=None)

CHOSEN = {  # adapter: (dtype, invariants)
    "torch_sdpa": ("float64", ("attention.causal_non_leakage", "attention.causal_weights_pattern",
                               "attention.weights_are_distributions", "attention.agrees_with_reference")),
    "torch_mha": ("float64", ("attention.causal_non_leakage", "attention.causal_gradient",
                              "attention.multi_head_is_sum_of_heads", "attention.agrees_with_reference")),
    "gpt2": ("float64", ("block.residual_identity", "block.causal_non_leakage", "block.agrees_with_reference",
                         "model.causal_non_leakage", "model.refuses_bad_ids", "model.agrees_with_reference",
                         "counts.gpt2_exact_counts")),
    "mixtral": ("float32", ("moe.top_k_gates_select_top_k", "moe.top_k_gates_agrees_with_reference",
                            "moe.load_balancing_loss_agrees_with_reference", "moe.moe_top_1_is_chosen_expert",
                            "moe.moe_agrees_with_reference")),
}
NEEDS_TRANSFORMERS = {"gpt2", "mixtral"}


def _adapter(name, dtype):
    if name in NEEDS_TRANSFORMERS:
        pytest.importorskip("transformers", reason=f"adapters.{name} wraps transformers, which is not installed (pip install transformers)")
    return load_implementation(f"adapters.{name}", dtype=dtype)


@pytest.mark.parametrize(
    "adapter, invariant", [(a, i) for a, (_, names) in CHOSEN.items() for i in names], ids=lambda v: v
)
def test_adapter_passes_invariant(adapter, invariant):
    impl = _adapter(adapter, CHOSEN[adapter][0])
    assert invariant in REGISTRY, f"{invariant} is not a registered invariant"
    outcome = run_invariant(REGISTRY[invariant], impl, settings=FEW)
    assert outcome.passed, outcome.report or outcome.reason


def test_mixtral_declares_no_tie_rule_and_skips_the_tie_invariant():
    impl = _adapter("mixtral", "float32")
    assert impl.namespace.TOP_K_TIES == "any"
    outcome = run_invariant(REGISTRY["moe.top_k_gates_tie_rule"], impl, settings=FEW)
    assert outcome.status == "skipped" and outcome.declared and "TOP_K_TIES" in outcome.reason, outcome


def test_mixtral_balance_loss_is_transformers_divided_by_k():
    _adapter("mixtral", "float32")
    import torch
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    from adapters.mixtral import load_balancing_loss

    logits = torch.tensor([[0.5, 0.0, -1.0, 2.0], [1.0, 1.5, 0.0, -0.5], [0.0, 0.25, 3.0, 1.0]])
    k = 2
    assert load_balancing_loss(logits, k) * k == load_balancing_loss_func((logits,), 4, k)


def test_gpt2_counts_the_tied_head_once():
    _adapter("gpt2", "float64")
    from adapters.gpt2 import gpt_param_count

    assert gpt_param_count(50257, 768, 12, 1024, True) == 124_439_808
    assert gpt_param_count(50257, 768, 12, 1024, False) == 124_402_944
