"""The layer-types laws held to code nobody here wrote: transformers' Qwen2, Ministral, Gemma 2, Gemma 3 and gpt-oss, whole models.

Each model is built from a config with the published model's settings at the suite's widths (no download, no weights read), its
`layer_types`, `sliding_window` and RoPE base(s) the suite's, its weights the suite's Llama params (functional_call: nothing is
copied), and it runs forward (hybrid_logits) and chunk by chunk on the library's own DynamicCache (hybrid_decode), which
config.layer_types gives a sliding cache layer where a layer slides. The adapters are namespaces of this file (an --impl target
too: `--impl tests/test_layer_types_transformers.py:Gemma3Hybrid`).

- Qwen2 and Ministral are Llama-shaped (RMSNorm pre-norms, GQA with RoPE, SwiGLU; Qwen2 with q/k/v biases): every law runs,
  the reference's agreement included. Both have one rope_theta for every layer (ROPE_BASE_PER_LAYER_TYPE = False).
- Gemma 2 (post-norms, GeGLU, √d-scaled embedding, softcapped scores and logits), Gemma 3 (QK-norm, a RoPE base per type) and
  gpt-oss (attention sinks, q/k/v/o biases, a clamped SwiGLU expert behind a router) are not: the laws that compare with the
  Llama block (one_type_is_llama against llama_logits, hybrid_logits_agree_with_reference against the reference's function)
  do not apply, and they are held to the intrinsic ones (INTRINSIC). Their extra weights are set so that the suite's gains
  are the model's and the rest is neutral: Gemma's (1 + w) norms get w = gain - 1 and 0 for the post-norms and QK-norms
  (which still normalise); gpt-oss has one expert (k = 1: every token through it with weight 1, its router's weights 0,
  so that no token's routing depends on another's), its sinks fixed at linspace(-1, 1, H) (each head's own, none zero).

The ci profile, float32: zero false alarms.
"""

import copy

import pytest

pytest.importorskip("transformers", reason="the models are transformers' own")

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2 as gemma2  # noqa: E402
from transformers.models.gemma3 import modeling_gemma3 as gemma3  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss  # noqa: E402
from transformers.models.ministral import modeling_ministral as ministral  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2 as qwen2  # noqa: E402

from invariants import REGISTRY, Implementation, all_invariants, run_invariant  # noqa: E402
from invariants.adapters import mistral as mistral_adapter  # noqa: E402
from invariants.adapters import qwen2 as qwen2_adapter  # noqa: E402
from invariants.adapters import toolkit  # noqa: E402
from invariants.adapters.toolkit import T, each  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402
from invariants.strategies.layer_types import FULL, SLIDING, gemma_layer_types, qwen2_layer_types  # noqa: E402

all_invariants()
CI = profile_settings("ci")

# The published settings (config.json of each model) kept at the suite's widths; the window and the bases are the suite's. Qwen2's
# and Ministral's are their config classes' defaults (SiLU, Qwen2's q/k/v biases), their eps the protocol's (they meet the reference).
GEMMA_2 = dict(hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
               rms_norm_eps=1e-6)  # google/gemma-2-9b: window 4096, one rope_theta 10,000
GEMMA_3 = dict(hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6)  # google/gemma-3-4b-pt: window 1024, bases 10,000 and 1,000,000
GPT_OSS = dict(num_local_experts=1, num_experts_per_tok=1, attention_bias=True, rms_norm_eps=1e-5)  # openai/gpt-oss-20b: window 128
PROTOCOL_EPS = 1e-5
MAX_POSITIONS = 4096


def _sizes(params, n_heads, n_kv_heads, layer_types, window, rope_bases):
    """The sizes a model is built from (hashable: toolkit.module builds once per set)."""
    block = params["blocks"][0]
    (vocab, d), d_ff = params["embed"].shape, block["W_gate"].shape[1]
    return dict(vocab_size=vocab, hidden_size=d, intermediate_size=d_ff, num_hidden_layers=len(params["blocks"]), num_attention_heads=n_heads,
                num_key_value_heads=n_kv_heads, head_dim=block["W_q"].shape[1] // n_heads, layer_types=tuple(layer_types), sliding_window=window,
                sliding_base=float(rope_bases[SLIDING]), full_base=float(rope_bases[FULL]))


def _one_base(sliding_base, full_base):
    """The rope_parameters of a model with one rope_theta: it refuses two bases (ROPE_BASE_PER_LAYER_TYPE = False draws one)."""
    if sliding_base != full_base:
        raise ValueError(f"this model has one rope_theta for every layer: got {sliding_base} (sliding) and {full_base} (full)")
    return {"rope_type": "default", "rope_theta": sliding_base}


def _common(sizes):
    """The config keywords every model here takes the same way: the widths, the layer types, no special tokens, no tied head."""
    return dict(sizes, layer_types=list(sizes["layer_types"]), bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
                max_position_embeddings=MAX_POSITIONS)


def _library_cache(config):
    return DynamicCache(config=config)


def _hybrid(causal_lm, config, layout, *, attention, declarations, cache=_library_cache, **functions):
    """A namespace with hybrid_logits and hybrid_decode: causal_lm(config(**sizes)) in `attention`, the suite's params laid out by
    `layout` (a toolkit layout of the model), decoded on cache(model config) (the library's DynamicCache(config=...))."""

    def build(*, dtype=None, device=None, **sizes):  # the toolkit moves the model to dtype and device
        made = config(**sizes)
        made._attn_implementation = attention
        return causal_lm(made)

    def model(ids, params, *arguments):
        target = toolkit.module(build, like=params["embed"], **_sizes(params, *arguments))
        if toolkit.bad_ids(ids, params["embed"].shape[0], MAX_POSITIONS):
            raise ValueError(f"token ids must lie in [0, {params['embed'].shape[0]})")
        return target, toolkit.weights(layout, {**params, "n_heads": arguments[0]})

    def hybrid_logits(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases):
        target, values = model(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases)
        return toolkit.call(target, values, ids, forward=lambda lm, i: lm(input_ids=i).logits)

    def hybrid_decode(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases, chunks):
        target, values = model(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases)
        held = cache(target.config)
        logits, sizes, start = [], [], 0
        for n in (int(c) for c in chunks):
            step = lambda lm, i: lm(input_ids=i, cache=held, use_cache=True).logits  # noqa: E731 - one call per chunk
            logits.append(toolkit.call(target, values, ids[:, start : start + n], forward=step))
            sizes.append(sum(layer.keys.numel() + layer.values.numel() for layer in held.layers))
            start += n
        return torch.cat(logits, dim=1), torch.tensor(sizes, dtype=torch.int64)

    return type(causal_lm.__name__.replace("ForCausalLM", "Hybrid"), (), {
        "BACKEND": "torch", **declarations, "hybrid_logits": staticmethod(hybrid_logits), "hybrid_decode": staticmethod(hybrid_decode),
        **{name: staticmethod(f) for name, f in functions.items()}})


LLAMA_BLOCK = {"input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": T("W_q"), "self_attn.k_proj.weight": T("W_k"),
               "self_attn.v_proj.weight": T("W_v"), "self_attn.o_proj.weight": T("W_o"), "post_attention_layernorm.weight": "ffn_norm",
               "mlp.gate_proj.weight": T("W_gate"), "mlp.up_proj.weight": T("W_up"), "mlp.down_proj.weight": T("W_down")}
QKV_BIAS = {"self_attn.q_proj.bias": "b_q", "self_attn.k_proj.bias": "b_k", "self_attn.v_proj.bias": "b_v"}  # zeros where not drawn


def _model_layout(block):
    return {"model.embed_tokens.weight": "embed", "model.layers.{}.": each("blocks", block), "model.norm.weight": "norm",
            "lm_head.weight": T("W_out")}


# ---------------------------------------------------------------------------
# Llama-shaped: Qwen2 (max_window_layers, q/k/v biases) and Ministral
# ---------------------------------------------------------------------------


def _qwen2_config(*, sliding_window, sliding_base, full_base, **sizes):
    return qwen2.Qwen2Config(**_common(sizes), use_sliding_window=sliding_window is not None, sliding_window=sliding_window,
                             rms_norm_eps=PROTOCOL_EPS, rope_parameters=_one_base(sliding_base, full_base))


def _ministral_config(*, sliding_window, sliding_base, full_base, **sizes):
    return ministral.MinistralConfig(**_common(sizes), sliding_window=sliding_window, rms_norm_eps=PROTOCOL_EPS,
                                     rope_parameters=_one_base(sliding_base, full_base))


LLAMA_SHAPED = dict(ROPE_PAIRING="half_split", ROPE_BASE_PER_LAYER_TYPE=False)
Qwen2Hybrid = _hybrid(qwen2.Qwen2ForCausalLM, _qwen2_config, _model_layout({**LLAMA_BLOCK, **QKV_BIAS}), attention="sdpa",
                      declarations=dict(LLAMA_SHAPED, QKV_BIASES=True), llama_logits=qwen2_adapter.llama_logits)
MinistralHybrid = _hybrid(ministral.MinistralForCausalLM, _ministral_config, _model_layout(LLAMA_BLOCK), attention="sdpa",
                          declarations=LLAMA_SHAPED, llama_logits=mistral_adapter.llama_logits)


# ---------------------------------------------------------------------------
# Gemma 2 and Gemma 3: (1 + w) norms around attention and the MLP, GeGLU; Gemma 3's QK-norm and a RoPE base per type
# ---------------------------------------------------------------------------


def _gain(key):
    """A Gemma norm's w for the suite's gain: (1 + w) = gain."""
    return lambda params: params[key] - 1


def _unit_gain(key):
    """w = 0, a Gemma norm of gain 1 (it still normalises), sized like params[key]."""
    return lambda params: torch.zeros_like(params[key])


def _head_gain(params):
    """w = 0 for Gemma 3's QK-norms, over one head's width (D,)."""
    return params["W_q"].new_zeros(params["W_q"].shape[1] // params["n_heads"])


GEMMA_BLOCK = {"input_layernorm.weight": _gain("attn_norm"), "self_attn.q_proj.weight": T("W_q"), "self_attn.k_proj.weight": T("W_k"),
               "self_attn.v_proj.weight": T("W_v"), "self_attn.o_proj.weight": T("W_o"), "post_attention_layernorm.weight": _unit_gain("attn_norm"),
               "pre_feedforward_layernorm.weight": _gain("ffn_norm"), "post_feedforward_layernorm.weight": _unit_gain("ffn_norm"),
               "mlp.gate_proj.weight": T("W_gate"), "mlp.up_proj.weight": T("W_up"), "mlp.down_proj.weight": T("W_down")}
GEMMA_MODEL = {**_model_layout(GEMMA_BLOCK), "model.norm.weight": _gain("norm")}


def _gemma2_config(*, sliding_window, sliding_base, full_base, head_dim, **sizes):
    return gemma2.Gemma2Config(**_common(sizes), **GEMMA_2, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=sliding_window,
                               rope_parameters=_one_base(sliding_base, full_base))


def _gemma3_config(*, sliding_window, sliding_base, full_base, head_dim, **sizes):
    bases = {SLIDING: {"rope_type": "default", "rope_theta": sliding_base}, FULL: {"rope_type": "default", "rope_theta": full_base}}
    return gemma3.Gemma3TextConfig(**_common(sizes), **GEMMA_3, head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=sliding_window,
                                   rope_parameters=bases)


GEMMA_2_PARTS = dict(causal_lm=gemma2.Gemma2ForCausalLM, config=_gemma2_config, layout=GEMMA_MODEL, attention="eager",  # the softcap is eager's
                     declarations=dict(ROPE_PAIRING="half_split", ROPE_BASE_PER_LAYER_TYPE=False))
Gemma2Hybrid = _hybrid(**GEMMA_2_PARTS)
Gemma3Hybrid = _hybrid(gemma3.Gemma3ForCausalLM, _gemma3_config,
                       {**GEMMA_MODEL, "model.layers.{}.": each("blocks", {**GEMMA_BLOCK, "self_attn.q_norm.weight": _head_gain,
                                                                           "self_attn.k_norm.weight": _head_gain})},
                       attention="eager", declarations=dict(ROPE_PAIRING="half_split"))


# ---------------------------------------------------------------------------
# gpt-oss: sinks, q/k/v/o biases, one expert
# ---------------------------------------------------------------------------


def _gpt_oss_config(*, sliding_window, sliding_base, full_base, **sizes):
    config = gpt_oss.GptOssConfig(**_common(sizes), **GPT_OSS, sliding_window=sliding_window, rope_parameters=_one_base(sliding_base, full_base))
    config._experts_implementation = "eager"  # the loop over experts: the CPU's default, grouped_mm, refuses widths not a multiple of 16 bytes
    return config


def _interleaved_gate_up(params):
    """(1, d, 2F): the one expert's gate_up_proj, gate and up columns interleaved as GptOssExperts reads them (gate_up[..., ::2])."""
    d, F = params["W_gate"].shape
    return torch.stack([params["W_gate"], params["W_up"]], dim=-1).reshape(1, d, 2 * F)


def _sinks(params):
    heads = params["n_heads"]
    return torch.linspace(-1.0, 1.0, heads, dtype=params["W_q"].dtype)


GPT_OSS_BLOCK = {"input_layernorm.weight": "attn_norm", "self_attn.sinks": _sinks, "self_attn.o_proj.bias": "b_o",
                 **{name: spec for name, spec in {**LLAMA_BLOCK, **QKV_BIAS}.items() if not name.startswith(("mlp.", "input_"))},
                 "mlp.router.weight": lambda p: torch.zeros_like(p["W_gate"][:, :1].T), "mlp.router.bias": lambda p: p["W_gate"].new_zeros(1),
                 "mlp.experts.gate_up_proj": _interleaved_gate_up,
                 "mlp.experts.gate_up_proj_bias": lambda p: p["W_gate"].new_zeros(1, 2 * p["W_gate"].shape[1]),
                 "mlp.experts.down_proj": lambda p: p["W_down"][None],
                 "mlp.experts.down_proj_bias": lambda p: p["W_down"].new_zeros(1, p["W_down"].shape[1])}
GPT_OSS_PARTS = dict(causal_lm=gpt_oss.GptOssForCausalLM, config=_gpt_oss_config, layout=_model_layout(GPT_OSS_BLOCK),
                     attention="eager", declarations=dict(ROPE_PAIRING="half_split", QKV_BIASES=True, ROPE_BASE_PER_LAYER_TYPE=False))
GptOssHybrid = _hybrid(**GPT_OSS_PARTS)  # eager: the sinks are eager's


# ---------------------------------------------------------------------------
# The laws each is held to
# ---------------------------------------------------------------------------

ALL = [name for name in REGISTRY if name.startswith("layer_types.")]
# one_type_is_llama needs llama_logits and hybrid_logits_agree_with_reference the reference's Llama model: not these blocks
INTRINSIC = [name for name in ALL if name not in ("layer_types.one_type_is_llama", "layer_types.hybrid_logits_agree_with_reference")]
LAWS = {"Qwen2Hybrid": ALL, "MinistralHybrid": ALL, "Gemma2Hybrid": INTRINSIC, "Gemma3Hybrid": INTRINSIC, "GptOssHybrid": INTRINSIC}
CASES = [(adapter, name) for adapter, names in LAWS.items() for name in names]


def _implementation(adapter, label=None):
    return Implementation(adapter, label=label or adapter.__name__, backend="torch", dtype="float32")


@pytest.mark.parametrize(("adapter", "name"), CASES, ids=[f"{adapter}-{name}" for adapter, name in CASES])
def test_transformers_models_pass_the_layer_types_laws_at_ci(adapter, name):
    outcome = run_invariant(REGISTRY[name], _implementation(globals()[adapter]), settings=CI)
    assert outcome.status in ("passed", "skipped"), outcome.report or outcome.reason


def test_every_adapter_is_held_to_laws_that_run():
    """At least three laws run on each model (none skipped for it), and the one a declaration skips is skipped for it only."""
    running = {adapter: [name for name in names if REGISTRY[name].skip_reason(_implementation(globals()[adapter])) is None]
               for adapter, names in LAWS.items()}
    assert all(len(names) >= 3 for names in running.values()), running
    assert "layer_types.rope_base_read_by_type" in running["Gemma3Hybrid"]


# ---------------------------------------------------------------------------
# A bug in front of each adapter: the laws see it through transformers' code
# ---------------------------------------------------------------------------

LAYER_TYPES, ROPE_BASES = 4, 6  # the positions of layer_types and rope_bases in hybrid_logits' and hybrid_decode's arguments


def _broken(adapter, position, change):
    """adapter with the argument at `position` of hybrid_logits and hybrid_decode replaced by change(argument) before the model sees it."""

    def broken(function):
        def call(*arguments):
            return function(*arguments[:position], change(arguments[position]), *arguments[position + 1 :])

        return staticmethod(call)

    return type(f"Broken{adapter.__name__}", (adapter,), {name: broken(getattr(adapter, name)) for name in ("hybrid_logits", "hybrid_decode")})


def _swapped(layer_types):
    return [FULL if kind == SLIDING else SLIDING for kind in layer_types]


def _sliding_everywhere(config):
    """The library's DynamicCache built as if every layer slid: the global layers' cache keeps only the window's last keys."""
    config = copy.deepcopy(config)
    config.layer_types = [SLIDING] * len(config.layer_types)
    return DynamicCache(config=config)


BROKEN = {  # (the adapter, the law): the adapter with a shipped bug put in front of transformers' model, which the law must catch
    ("Qwen2", "layer_types.one_type_is_llama"):  # max_window_layers lost, the window on every layer (huggingface/transformers#36162)
        _broken(Qwen2Hybrid, LAYER_TYPES, lambda types: [SLIDING] * len(types)),
    ("Qwen2", "layer_types.hybrid_logits_agree_with_reference"):  # the pattern one layer off (NVIDIA-NeMo/Megatron-Bridge#4875)
        _broken(Qwen2Hybrid, LAYER_TYPES, lambda types: [*types[1:], types[0]]),
    ("Ministral", "layer_types.far_tokens_unseen_by_sliding_layers"):  # the window never applied (lablup/mlxcel#495)
        _broken(MinistralHybrid, LAYER_TYPES, lambda types: [FULL] * len(types)),
    ("Gemma3", "layer_types.rope_base_read_by_type"):  # the global layers on the local base (Lightning-AI/litgpt#1993)
        _broken(Gemma3Hybrid, ROPE_BASES, lambda bases: {SLIDING: bases[SLIDING], FULL: bases[SLIDING]}),
    ("GptOss", "layer_types.far_tokens_unseen_by_sliding_layers"):  # local and global swapped (huggingface/transformers#31775)
        _broken(GptOssHybrid, LAYER_TYPES, _swapped),
    ("Gemma2", "layer_types.hybrid_decode_matches_full_forward"):  # a sliding cache for the global layers too (vllm-project/vllm#51756)
        _hybrid(**GEMMA_2_PARTS, cache=_sliding_everywhere),
    ("GptOss", "layer_types.hybrid_cache_law"):  # the same, on gpt-oss
        _hybrid(**GPT_OSS_PARTS, cache=_sliding_everywhere),
}


@pytest.mark.parametrize(("model", "name"), BROKEN, ids=[f"{model}-{name}" for model, name in BROKEN])
def test_the_adapters_let_the_laws_see_a_bug(model, name):
    """Each adapter passes transformers' answer on: the bug put in front of it fails the law that names it."""
    outcome = run_invariant(REGISTRY[name], _implementation(BROKEN[model, name], label=f"broken {model}"), settings=CI)
    assert outcome.status == "failed", outcome.reason


def test_the_strategies_patterns_are_transformers_own():
    """The layer types the strategies draw as Qwen2's, Gemma 2's, gpt-oss's and Gemma 3's are those their configs build, and Gemma
    3's default bases are the published 10,000 (local) and 1,000,000 (global)."""
    for layers in range(1, 13):
        for first_full in range(layers + 1):
            config = qwen2.Qwen2Config(num_hidden_layers=layers, use_sliding_window=True, sliding_window=4, max_window_layers=first_full)
            assert tuple(config.layer_types) == qwen2_layer_types(layers, first_full)
        assert tuple(gemma2.Gemma2Config(num_hidden_layers=layers).layer_types) == gemma_layer_types(layers, 2)
        assert tuple(gpt_oss.GptOssConfig(num_hidden_layers=layers).layer_types) == gemma_layer_types(layers, 2)
        assert tuple(gemma3.Gemma3TextConfig(num_hidden_layers=layers).layer_types) == gemma_layer_types(layers, 6)
    bases = gemma3.Gemma3TextConfig().rope_parameters
    assert (bases[SLIDING]["rope_theta"], bases[FULL]["rope_theta"]) == (10_000.0, 1_000_000.0)
