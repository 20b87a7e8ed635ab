"""The routing laws held to code nobody here wrote: transformers' routers of DeepSeek-V3, Qwen3-MoE, gpt-oss and Mixtral.

Each router is built from a config with the published model's routing settings scaled down (no download, no weights read):
the suite's router logits stand in for the output of the router's linear layer (its module's F.linear answers its input as
it is, -inf included, where an identity weight would make -inf · 0 = NaN), so the router's own code chooses and weighs.
The adapters are namespaces of this file (an --impl target too: `--impl tests/test_routing_transformers.py:DeepseekV3Router`).
The ci profile, float32: zero false alarms.
"""

import functools
import sys
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the routers are transformers' own")

import torch  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Config, DeepseekV3MoE, DeepseekV3TopkRouter  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssConfig, GptOssTopKRouter  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import load_balancing_loss_func as gpt_oss_balance_loss  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeConfig, Qwen3MoeTopKRouter  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func as qwen3_balance_loss  # noqa: E402

from invariants import REGISTRY, Implementation, all_invariants, load_implementation, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

all_invariants()
CI = profile_settings("ci")

# The published routing settings (config.json of each model) and the scaled-down ones built here.
DEEPSEEK_V3 = dict(n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5,
                   n_shared_experts=1)
DEEPSEEK_V3_SMALL = dict(n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                         n_shared_experts=1)  # k / topk_group = 2, as 8 / 4 in the published model
QWEN3_MOE = dict(num_experts=128, num_experts_per_tok=8, norm_topk_prob=True)  # Qwen3-30B-A3B
GPT_OSS = dict(num_local_experts=32, num_experts_per_tok=4)  # gpt-oss-20b


class _LinearAnswersTheLogits:
    """Stands in for torch.nn.functional in a router's module during a call: its linear layer answers the suite's logits."""

    @staticmethod
    def linear(x, weight, bias=None):
        return x


def _routed(router, logits):
    """router(logits) with the logits as its linear layer's output: (logits, weights (N, k), indices (N, k))."""
    with torch.no_grad(), mock.patch.object(sys.modules[type(router).__module__], "F", _LinearAnswersTheLogits):
        return router(logits)


def _scattered(like, weights, indices):
    return torch.zeros_like(like).scatter(-1, indices, weights.to(like.dtype))


@functools.cache
def _deepseek_router(E, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    config = DeepseekV3Config(hidden_size=E, n_routed_experts=E, num_experts_per_tok=k, n_group=n_group, topk_group=topk_group,
                              norm_topk_prob=norm_topk_prob, routed_scaling_factor=routed_scaling_factor)
    return DeepseekV3TopkRouter(config).eval()


class DeepseekV3Router:
    """DeepseekV3TopkRouter behind grouped_top_k_gates: it computes in float32 (COMPUTE_DTYPE) and breaks ties by torch.topk."""

    BACKEND, COMPUTE_DTYPE, TOP_K_TIES = "torch", "float32", "any"

    @staticmethod
    def grouped_top_k_gates(router_logits, bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
        router = _deepseek_router(router_logits.shape[-1], k, n_group, topk_group, bool(norm_topk_prob), float(routed_scaling_factor))
        router.e_score_correction_bias.copy_(bias.float())
        _, weights, indices = _routed(router, router_logits)
        return _scattered(router_logits, weights, indices)


@functools.cache
def _qwen3_router(E, k, norm_topk_prob):
    config = Qwen3MoeConfig(hidden_size=E, num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm_topk_prob)
    return Qwen3MoeTopKRouter(config).eval()


class Qwen3MoeRouter:
    """Qwen3MoeTopKRouter behind softmax_top_k_gates (softmax in float32), and its load_balancing_loss_func, k × the Switch loss, over k."""

    BACKEND, COMPUTE_DTYPE, TOP_K_TIES = "torch", "float32", "any"

    @staticmethod
    def softmax_top_k_gates(router_logits, k, norm_topk_prob):
        _, weights, indices = _routed(_qwen3_router(router_logits.shape[-1], k, bool(norm_topk_prob)), router_logits)
        return _scattered(router_logits, weights, indices)

    @staticmethod
    def load_balancing_loss(router_logits, k):
        return qwen3_balance_loss((router_logits,), router_logits.shape[-1], k) / k


@functools.cache
def _gpt_oss_router(E, k):
    return GptOssTopKRouter(GptOssConfig(hidden_size=E, num_local_experts=E, num_experts_per_tok=k)).eval()


class GptOssRouter:
    """GptOssTopKRouter behind top_k_gates (top-k on the logits, softmax over the chosen in the logits' dtype), and its balance loss over k."""

    BACKEND, TOP_K_TIES = "torch", "any"

    @staticmethod
    def top_k_gates(router_logits, k):
        _, weights, indices = _routed(_gpt_oss_router(router_logits.shape[-1], k), router_logits)
        return _scattered(router_logits, weights, indices)

    @staticmethod
    def load_balancing_loss(router_logits, k):
        return gpt_oss_balance_loss((router_logits,), router_logits.shape[-1], k) / k


ROUTERS = {  # adapter: the laws it is held to (every law of the functions it provides)
    "DeepseekV3Router": [name for name in REGISTRY if name.startswith("routing.grouped_top_k_gates")],
    "Qwen3MoeRouter": [name for name in REGISTRY if name.startswith("routing.softmax_top_k_gates") and "is_top_k_gates" not in name]
                      + [name for name in REGISTRY if name.startswith("moe.load_balancing_loss")],
    "GptOssRouter": [name for name in REGISTRY if name.startswith(("moe.top_k_gates", "moe.load_balancing_loss"))],
    # not moe.top_k_gates_masked_experts: this adapter feeds the logits through an identity weight, and -inf · 0 is NaN
    "invariants.adapters.mixtral": [name for name in REGISTRY if name.startswith(("moe.top_k_gates", "moe.load_balancing_loss"))
                                    and name != "moe.top_k_gates_masked_experts"],
}
CASES = [(adapter, name) for adapter, names in ROUTERS.items() for name in names]


def _implementation(adapter):
    if adapter.startswith("invariants."):
        return load_implementation(adapter, dtype="float32")
    return Implementation(globals()[adapter], label=adapter, backend="torch", dtype="float32")


@pytest.mark.parametrize(("adapter", "name"), CASES, ids=[f"{a.rsplit('.', 1)[-1]}-{n}" for a, n in CASES])
def test_transformers_routers_pass_the_routing_laws_at_ci(adapter, name):
    outcome = run_invariant(REGISTRY[name], _implementation(adapter), settings=CI)
    assert outcome.status in ("passed", "skipped"), outcome.report or outcome.reason


def test_every_router_is_held_to_laws_that_run():
    assert all(len(names) >= 5 for names in ROUTERS.values()), {adapter: len(names) for adapter, names in ROUTERS.items()}


def test_the_published_deepseek_v3_config_routes_as_the_protocol_says():
    """DeepSeek-V3's published routing settings (256 experts in 8 groups, 4 kept, k = 8, scaling 2.5) on random logits and biases:
    transformers' router equals the reference, and the scaled-down model's MoE layer adds its shared expert to every token."""
    rng = np.random.default_rng(0)
    E, k, G, kept = DEEPSEEK_V3["n_routed_experts"], DEEPSEEK_V3["num_experts_per_tok"], DEEPSEEK_V3["n_group"], DEEPSEEK_V3["topk_group"]
    logits, bias = rng.normal(size=(64, E)), rng.normal(size=E) * 0.1  # distinct scores: no ties, float64 throughout
    router = DeepseekV3Router.grouped_top_k_gates
    got = router(torch.tensor(logits), torch.tensor(bias), k, G, kept, True, DEEPSEEK_V3["routed_scaling_factor"]).numpy()
    import invariants.reference.numpy as ref

    expected = ref.grouped_top_k_gates(logits.astype(np.float32).astype(np.float64), bias.astype(np.float32).astype(np.float64), k, G, kept,
                                       True, DEEPSEEK_V3["routed_scaling_factor"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.allclose(got.sum(axis=-1), 2.5)

    small = DeepseekV3Config(hidden_size=8, moe_intermediate_size=4, first_k_dense_replace=0, **DEEPSEEK_V3_SMALL)
    moe = DeepseekV3MoE(small).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn_like(p))
        moe.experts.down_proj.zero_()  # the routed experts answer 0: what is left is the shared expert, always on
        x = torch.randn(1, 5, 8)
        assert torch.allclose(moe(x), moe.shared_experts(x), atol=1e-6)
