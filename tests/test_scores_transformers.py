"""The scores laws held to code nobody here wrote: transformers' BLOOM (ALiBi), Gemma 2 (softcapping) and gpt-oss (attention sinks).

Each attention module is built from a config with the published model's settings and the suite's head counts and widths (no
download, no weights read): the suite's q, k and v stand in for the outputs of the module's projections, so the model's own code
scores, masks and weighs. BLOOM runs whole (BloomAttention.forward: its fused projection answers the suite's q, k, v; its KV cache
holds the S - T keys before the queries; its mask is create_causal_mask's and its bias build_alibi_tensor's, the slopes the
suite's); Gemma 2 and gpt-oss run their eager_attention_forward (softcap=, the module's sinks) under the mask transformers'
masking_utils builds (eager_mask: 0 where a query sees a key, finfo.min elsewhere). An additive finfo.min mask gives a query that
sees no key the weights 1/S on every key (FULLY_MASKED_ROWS = "uniform"); gpt-oss's sink takes such a row whole (weights 0).
The adapters are namespaces of this file (an --impl target too: `--impl tests/test_scores_transformers.py:Gemma2Scores`).
The ci profile, float32: zero false alarms.
"""

import functools
from unittest import mock

import pytest

pytest.importorskip("transformers", reason="the attention is transformers' own")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    bidirectional_mask_function,
    causal_mask_function,
    create_causal_mask,
    eager_mask,
    sliding_window_causal_mask_function,
)
from transformers.modeling_outputs import BaseModelOutputWithPast  # noqa: E402
from transformers.models.bloom import modeling_bloom as bloom  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2 as gemma2  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss  # noqa: E402

import invariants.reference.numpy as ref  # noqa: E402
from invariants import REGISTRY, Implementation, all_invariants, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

all_invariants()
CI = profile_settings("ci")

# The published settings (config.json of each model); the head counts and widths of each call are the suite's.
BLOOM = dict(n_head=112, hidden_size=14336)  # bigscience/bloom: 112 heads, not a power of two
GEMMA_2 = dict(num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
               final_logit_softcapping=30.0, sliding_window=4096)  # google/gemma-2-9b
GPT_OSS = dict(num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128)  # openai/gpt-oss-20b


class _Answers(nn.Module):
    """Stands in for a module's projection: it answers the tensor it holds, whatever it is given."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def forward(self, *args, **kwargs):
        return self.answer


def _eager_mask(q, k, causal, key_mask, window):
    """(B, 1, T, S) transformers' additive eager mask: the T queries the last T of the S positions, a window on the causal mask."""
    T, S = q.shape[2], k.shape[2]
    if not causal:
        function = bidirectional_mask_function
    else:
        function = causal_mask_function if window is None else sliding_window_causal_mask_function(int(window))
    return eager_mask(q.shape[0], T, S, q_offset=S - T, mask_function=function, attention_mask=key_mask, dtype=q.dtype)


def _heads_first(out):
    """eager_attention_forward's (B, T, H, D) as (B, H, T, D)."""
    return out.transpose(1, 2)


# ---------------------------------------------------------------------------
# BLOOM: build_alibi_tensor, BloomAttention
# ---------------------------------------------------------------------------


@functools.cache
def _bloom_attention(n_heads, d_head):
    config = bloom.BloomConfig(hidden_size=n_heads * d_head, n_head=n_heads, n_layer=1, attention_dropout=0.0, hidden_dropout=0.0)
    config._attn_implementation = "eager"
    attention = bloom.BloomAttention(config, layer_idx=0).eval()
    attention.dense = nn.Identity()  # the output projection answers the heads merged
    return config, attention


class BloomAlibi:
    """BLOOM's build_alibi_tensor behind alibi_slopes, and BloomAttention (its KV cache, create_causal_mask and build_alibi_tensor with
    the suite's slopes) behind alibi_attention. BLOOM has no kv-head groups: the kv heads are repeated before its fused projection."""

    BACKEND, FULLY_MASKED_ROWS = "torch", "uniform"

    @staticmethod
    def alibi_slopes(n_heads):
        bias = bloom.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n_heads, torch.float32)  # (H, 1, 2): slopes[h]·(0, 1)
        return bias[:, 0, 1]

    @staticmethod
    def alibi_attention(q, k, v, slopes, key_mask):
        B, H, T, D = q.shape
        S = k.shape[2]
        config, attention = _bloom_attention(H, D)
        k, v = (x.repeat_interleave(H // x.shape[1], dim=1) for x in (k, v))  # (B, H, S, D)
        cache = DynamicCache(config=config)
        cache.update(k[:, :, : S - T], v[:, :, : S - T], layer_idx=0)  # the keys before the queries, as a decode holds them
        fused = torch.stack([q, k[:, :, S - T :], v[:, :, S - T :]], dim=3).transpose(1, 2).reshape(B, T, 3 * H * D)  # (B, T, H·3·D)
        padding = torch.ones(B, S, dtype=torch.long) if key_mask is None else key_mask.long()
        hidden = torch.zeros(B, T, H * D, dtype=q.dtype)
        mask = create_causal_mask(config=config, inputs_embeds=hidden, attention_mask=padding, cache=cache)
        with torch.no_grad(), mock.patch.object(bloom, "_get_alibi_slopes", lambda n_heads, device: slopes.float()):
            alibi = bloom.build_alibi_tensor(padding, H, q.dtype)  # (B·H, 1, S)
            attention.query_key_value = _Answers(fused)
            out, weights = attention(hidden, torch.zeros_like(hidden), alibi, mask, layer_past=cache)
        return out.reshape(B, T, H, D).transpose(1, 2), weights


# ---------------------------------------------------------------------------
# Gemma 2: softcapped eager attention, the final logits' softcap
# ---------------------------------------------------------------------------


@functools.cache
def _gemma2_attention(n_heads, n_kv_heads, d_head):
    config = gemma2.Gemma2Config(hidden_size=n_heads * d_head, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=d_head,
                                 query_pre_attn_scalar=d_head, num_hidden_layers=1, attention_dropout=0.0)
    return gemma2.Gemma2Attention(config, layer_idx=0).eval()


@functools.cache
def _gemma2_lm():
    """Gemma2ForCausalLM whose model answers the suite's logits as its last hidden state and whose head is the identity."""
    config = gemma2.Gemma2Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=4, final_logit_softcapping=GEMMA_2["final_logit_softcapping"])
    lm = gemma2.Gemma2ForCausalLM(config).eval()
    lm.lm_head = nn.Identity()
    return lm


class Gemma2Scores:
    """Gemma 2's eager_attention_forward (softcap=, scaling query_pre_attn_scalar^-0.5 with the scalar = head_dim, as gemma-2-2b and
    -9b publish) behind softcapped_attention, and Gemma2ForCausalLM's final_logit_softcapping behind softcap."""

    BACKEND, FULLY_MASKED_ROWS = "torch", "uniform"

    @staticmethod
    def softcapped_attention(q, k, v, causal, key_mask, window, cap):
        module = _gemma2_attention(q.shape[1], k.shape[1], q.shape[3])
        with torch.no_grad():
            out, weights = gemma2.eager_attention_forward(module, q, k, v, _eager_mask(q, k, causal, key_mask, window),
                                                          scaling=module.scaling, softcap=float(cap))
        return _heads_first(out), weights

    @staticmethod
    def softcap(x, cap):
        lm = _gemma2_lm()
        lm.model = _Answers(BaseModelOutputWithPast(last_hidden_state=x.reshape(1, -1, 1)))  # (1, N, 1): one logit per position
        lm.config.final_logit_softcapping = float(cap)
        with torch.no_grad():
            return lm(input_ids=torch.zeros(1, 1, dtype=torch.long)).logits.reshape(x.shape)


# ---------------------------------------------------------------------------
# gpt-oss: eager attention with sinks
# ---------------------------------------------------------------------------


@functools.cache
def _gpt_oss_attention(n_heads, n_kv_heads, d_head):
    config = gpt_oss.GptOssConfig(hidden_size=n_heads * d_head, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=d_head,
                                  num_hidden_layers=1, attention_dropout=0.0)
    return gpt_oss.GptOssAttention(config, layer_idx=0).eval()


class GptOssSinks:
    """gpt-oss's eager_attention_forward (the module's sinks, s_aux, in each softmax; scaling head_dim^-0.5) behind sink_attention."""

    BACKEND = "torch"

    @staticmethod
    def sink_attention(q, k, v, causal, key_mask, window, sinks):
        module = _gpt_oss_attention(q.shape[1], k.shape[1], q.shape[3])
        with torch.no_grad():
            module.sinks.data = sinks.to(q.dtype)
            out, weights = gpt_oss.eager_attention_forward(module, q, k, v, _eager_mask(q, k, causal, key_mask, window), scaling=module.scaling)
        return _heads_first(out), weights


FUNCTIONS_HELD = {  # adapter: the protocol functions it provides, held to every law that requires one of them
    "BloomAlibi": ("alibi_slopes", "alibi_attention"),
    "Gemma2Scores": ("softcap", "softcapped_attention"),
    "GptOssSinks": ("sink_attention",),
}
LAWS = {adapter: [name for name, law in REGISTRY.items() if set(law.requires) & set(functions)] for adapter, functions in FUNCTIONS_HELD.items()}
CASES = [(adapter, name) for adapter, names in LAWS.items() for name in names]


@pytest.mark.parametrize(("adapter", "name"), CASES, ids=[f"{adapter}-{name}" for adapter, name in CASES])
def test_transformers_scores_pass_the_scores_laws_at_ci(adapter, name):
    outcome = run_invariant(REGISTRY[name], Implementation(globals()[adapter], label=adapter, backend="torch", dtype="float32"), settings=CI)
    assert outcome.status in ("passed", "skipped"), outcome.report or outcome.reason


def _broken(adapter, function, change):
    """adapter with its `function` replaced by change(function)."""
    return type(f"Broken{adapter.__name__}", (adapter,), {function: staticmethod(change(getattr(adapter, function)))})


BROKEN = {  # a law: the adapter with the bug it names put in front of transformers' code, which it must catch through the adapter
    "scores.alibi_attention_decays_with_distance":  # the bias's sign flipped
        _broken(BloomAlibi, "alibi_attention", lambda f: lambda q, k, v, slopes, key_mask: f(q, k, v, -slopes, key_mask)),
    "scores.softcapped_attention_weights_bounded":  # the cap as good as dropped (hardcoded off: vllm-project/vllm-metal#665)
        _broken(Gemma2Scores, "softcapped_attention", lambda f: lambda *args: f(*args[:-1], 1e30)),  # the last argument: cap
    "scores.sink_attention_weights_sum_below_one":  # the sink left out of the softmax (hardcoded off: vllm-project/vllm-metal#550)
        _broken(GptOssSinks, "sink_attention", lambda f: lambda *args: f(*args[:-1], torch.full_like(args[-1], -torch.inf))),  # the last: sinks
}


@pytest.mark.parametrize("name", BROKEN)
def test_the_adapters_let_the_laws_see_a_bug(name):
    """Each adapter passes transformers' answer on: the bug put in front of it fails the law that names it."""
    outcome = run_invariant(REGISTRY[name], Implementation(BROKEN[name], label=name, backend="torch", dtype="float32"), settings=CI)
    assert outcome.status == "failed", outcome.reason


def test_every_adapter_is_held_to_laws_that_run():
    assert all(len(names) >= 5 for names in LAWS.values()), {adapter: len(names) for adapter, names in LAWS.items()}


def test_the_published_bloom_slopes_are_press_et_al():
    """BLOOM-176B's 112 heads (64, then every other of 128's): build_alibi_tensor's slopes equal the reference's, to float32's rounding."""
    got = BloomAlibi.alibi_slopes(BLOOM["n_head"]).double().numpy()
    assert got.shape == (112,)
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(ref.alibi_slopes(112)), rtol=1e-6, atol=0.0)
