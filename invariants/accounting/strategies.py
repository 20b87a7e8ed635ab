"""Hypothesis strategies for config.json mappings of every family the accounting counts, small enough to build in milliseconds.

    @given(model_configs())                                   # any family
    @given(model_configs(model_types=("mixtral",), max_layers=2))

Valid by construction (H = H_kv · group, k <= E, hidden_size = H·D unless head_dim is given);
optional keys are sometimes left out so that their defaults are exercised, and sometimes
written as null where transformers allows it (n_inner, head_dim, q_lora_rank).
"""

from __future__ import annotations

from hypothesis import strategies as st

from invariants.accounting.config import STYLES
from invariants.strategies._validation import InvalidArgument, check_int

ABSENT = object()  # a drawn "leave the key out"


def _maybe(values):
    """The key left out, or one of `values`."""
    return st.one_of(st.just(ABSENT), values)


def model_configs(*, model_types=None, max_layers=3, lesson_keys=True):
    """config.json dicts of the given model types (default: every one in invariants.accounting.STYLES), with 0 to max_layers layers.

    lesson_keys=False leaves out the one key transformers ignores and the accounting honours (GPT-2's
    attention_bias, the lesson's TinyGPT switch), for comparisons with transformers' own count.
    """
    types = sorted(STYLES) if model_types is None else list(model_types)
    unknown = [t for t in types if t not in STYLES]
    if not types or unknown:
        raise InvalidArgument(f"model_types={model_types!r} must name some of {', '.join(sorted(STYLES))}")
    check_int("max_layers", max_layers, low=0)

    @st.composite
    def configs(draw):
        model_type = draw(st.sampled_from(types))
        config = {"model_type": model_type, "vocab_size": draw(st.integers(1, 40)), "tie_word_embeddings": draw(_maybe(st.booleans()))}
        layers = draw(st.integers(0, max_layers))
        if model_type == "gpt2":
            heads, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 4))
            config.update(n_embd=heads * d_head, n_layer=layers, n_head=heads, n_positions=draw(st.integers(1, 8)),
                          n_inner=draw(_maybe(st.none() | st.integers(1, 16))))
            if lesson_keys:
                config["attention_bias"] = draw(_maybe(st.booleans()))
        elif model_type in ("qwen3_moe", "gemma3_text", "gemma3", "gpt_oss"):
            config.update(_modern(draw, model_type, layers))
        elif STYLES[model_type] == "llama":
            kv_heads, group, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
            heads = kv_heads * group
            explicit = draw(st.booleans())  # head_dim given, so hidden_size need not be H·D
            # transformers' LlamaConfig asks for a multiple of the heads even where head_dim is given
            width = heads * draw(st.integers(1, 4)) if model_type == "llama" else draw(st.integers(1, 16))
            config.update(hidden_size=width if explicit else heads * d_head, intermediate_size=draw(st.integers(1, 16)),
                          num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                          head_dim=d_head if explicit else ABSENT if model_type == "qwen2" else draw(_maybe(st.none())),
                          max_position_embeddings=draw(_maybe(st.integers(1, 64))))
            if model_type == "llama":
                if group == 1:  # Llama's default for num_key_value_heads is the query heads
                    config["num_key_value_heads"] = draw(_maybe(st.just(kv_heads)))
                config.update(attention_bias=draw(_maybe(st.booleans())), mlp_bias=draw(_maybe(st.booleans())))
            if model_type == "mixtral":
                experts = draw(st.integers(1, 4))
                config.update(num_local_experts=experts, num_experts_per_tok=draw(st.integers(1, experts)))
        else:  # DeepSeek's multi-head latent attention and shared experts
            heads, experts = draw(st.integers(1, 3)), draw(st.integers(1, 4))
            config.update(
                hidden_size=heads * draw(st.integers(1, 4)),  # DeepseekV2Config asks for a multiple of the heads
                intermediate_size=draw(st.integers(1, 8)), moe_intermediate_size=draw(st.integers(1, 6)),
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=draw(_maybe(st.just(heads))),
                n_routed_experts=experts, num_experts_per_tok=draw(st.integers(1, experts)), n_shared_experts=draw(st.integers(0, 2)),
                first_k_dense_replace=draw(st.integers(0, layers + 1) if model_type == "deepseek_v3" else _maybe(st.integers(0, layers + 1))),
                kv_lora_rank=draw(st.integers(1, 6)), q_lora_rank=draw(st.none() | st.integers(1, 6)),
                qk_nope_head_dim=draw(st.integers(1, 4)), qk_rope_head_dim=2 * draw(st.integers(1, 2)), v_head_dim=draw(st.integers(1, 4)),
                attention_bias=draw(_maybe(st.booleans())),
                n_group=1, topk_group=1,  # routing groups change no weights; one group fits any E
            )
            if model_type == "deepseek_v2":
                config["mlp_bias"] = draw(_maybe(st.booleans()))
        if model_type == "gemma3":  # the multimodal config: the text model's keys under text_config
            text = {key: config.pop(key) for key in list(config) if key not in ("model_type", "vocab_size", "tie_word_embeddings")}
            config["text_config"] = _present({**text, "vocab_size": config.pop("vocab_size"), "model_type": draw(_maybe(st.just("gemma3_text")))})
        return _present(config)

    return configs()


def _present(config):
    return {key: value for key, value in config.items() if value is not ABSENT}


def _modern(draw, model_type, layers):
    """The keys of a Qwen3-MoE, Gemma 3 (text) or gpt-oss config, with head_dim apart from hidden_size / heads."""
    kv_heads, group, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    heads = kv_heads * group
    gemma = model_type.startswith("gemma3")
    explicit = gemma or model_type == "gpt_oss" or draw(st.booleans())  # their head_dim defaults are sizes, so they give it
    # Gemma3TextConfig asks for a multiple of the heads; an absent head_dim means hidden_size / heads
    width = heads * draw(st.integers(1, 4)) if gemma or not explicit else draw(st.integers(1, 16))
    config = {"num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_size": width,
              "head_dim": d_head if explicit else ABSENT,
              "attention_bias": draw(_maybe(st.booleans())), "max_position_embeddings": draw(_maybe(st.integers(1, 64)))}
    if gemma:  # vocab_size may take its default
        return {**config, "intermediate_size": draw(st.integers(1, 16)), "vocab_size": draw(_maybe(st.integers(1, 40)))}
    experts = draw(st.integers(1, 4))
    config["num_experts_per_tok"] = k = draw(st.integers(1, experts))
    if model_type == "gpt_oss":
        return {**config, "num_local_experts": experts, "intermediate_size": draw(st.integers(1, 8)), "experts_per_token": draw(_maybe(st.just(k)))}
    step = draw(_maybe(st.integers(1, 3)))
    only = draw(_maybe(st.lists(st.integers(0, layers), max_size=2, unique=True)))  # an index past the last layer is allowed
    all_mixtures = step in (ABSENT, 1) and only in (ABSENT, [])
    return {**config, "num_experts": experts, "moe_intermediate_size": draw(st.integers(1, 6)), "decoder_sparse_step": step,
            "mlp_only_layers": only, "intermediate_size": draw(_maybe(st.integers(1, 8)) if all_mixtures else st.integers(1, 8))}
