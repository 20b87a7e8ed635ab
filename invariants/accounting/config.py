"""A config.json read into the numbers a parameter count needs, with transformers' defaults; one ConfigError line otherwise.

The keys are Hugging Face's (transformers 5: `configuration_<model_type>.py`). A key whose
transformers default is a structural convention (num_key_value_heads = num_attention_heads for
Llama, head_dim = hidden_size / num_attention_heads, tie_word_embeddings, attention_bias) takes that
default when absent; a key whose default is some model's size (Mistral's num_key_value_heads = 8,
DeepSeek-V2's q_lora_rank = 1536) is required, so that a count never quietly describes another model.

Dimension letters: V vocabulary, d model width, L layers, H query heads, H_kv key/value heads,
D head width, F feed-forward width, E routed experts, k experts per token, S shared experts,
F_e expert width.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

# model_type: the block's style. "gpt2": LayerNorm, GELU MLP with biases, learned positions;
# "llama": RMSNorm, gated MLP, rotary positions; "mla": the llama style with DeepSeek's multi-head latent attention.
# "gemma3" is Gemma 3's multimodal config: its text_config is counted, as Gemma3ForCausalLM builds it (no vision tower).
STYLES = {
    "gpt2": "gpt2",
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "llama",
    "qwen3_moe": "llama",
    "gemma3_text": "llama",
    "gemma3": "llama",
    "gpt_oss": "llama",
    "deepseek_v2": "mla",
    "deepseek_v3": "mla",
}
GEMMA3_VOCAB = 262_208  # transformers' Gemma3TextConfig default: Gemma 3's tokenizer with its image tokens, the same at every size
MISSING = object()


class ConfigError(ValueError):
    """A config that cannot be counted; str() is one line that names the key and what it expected."""


def _json(value):
    """A value as the config file spells it, and what kind of JSON value it is: '"32" (a string)'."""
    kind = {bool: "a boolean", str: "a string", float: "a decimal number", list: "a list", dict: "an object"}.get(type(value))
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError):
        shown = repr(value)
    if len(shown) > 60:
        shown = shown[:59] + "…"
    return f"{shown} ({kind})" if kind else shown


def bad_key(key, expected, got=MISSING):
    """The ConfigError for `key`: missing (got omitted) or holding `got` where `expected` was wanted."""
    if got is MISSING:
        return ConfigError(f'missing key "{key}": expected {expected}')
    return ConfigError(f'key "{key}": expected {expected}, got {_json(got)}')


@dataclass(frozen=True)
class Model:
    """One decoder-only transformer as the count sees it: the sizes and the variant flags, defaults applied."""

    model_type: str
    style: str  # "gpt2", "llama" or "mla" (STYLES)
    vocab: int  # V
    d_model: int  # d
    n_layers: int  # L
    n_heads: int  # H
    n_kv_heads: int  # H_kv: key/value heads (grouped-query attention); MLA caches a latent instead
    d_head: int  # D: query/key head width (MLA: qk_nope_head_dim + qk_rope_head_dim)
    d_ff: int  # F: the dense feed-forward width (0 when every layer is a mixture)
    tied: bool  # the output layer is the embedding table, counted once
    positions: int = 0  # rows of a learned position table (GPT-2's n_positions); rotary models have none
    context: int | None = None  # max_position_embeddings, for the KV cache of a full context
    qkv_bias: bool = False  # biases on the query, key and value projections
    o_bias: bool = False  # a bias on the output projection
    mlp_bias: bool = False  # biases in the SwiGLU MLPs (GPT-2's MLP always has them)
    n_experts: int = 0  # E routed experts per mixture layer (0: a dense model)
    experts_per_token: int = 0  # k
    d_expert: int = 0  # F_e: each routed expert's width (Mixtral: intermediate_size)
    n_shared: int = 0  # S: always-on experts, built as one MLP of width S·F_e
    dense_layers: tuple = ()  # in a mixture model, the indices of the layers that keep a dense MLP of width F
    moe_bias: bool = False  # gpt-oss: a bias on the router and on each routed expert's gate_up (2·F_e) and down (d) projections
    sinks: bool = False  # gpt-oss: one learned sink logit per query head in each layer's attention
    qk_norm: bool = False  # Qwen3, Gemma 3: an RMSNorm of width D on each query head and each key head
    norms_per_layer: int = 2  # RMSNorms around each block: 2 before attention and MLP; Gemma 3 adds 2 after them
    q_lora_rank: int = 0  # MLA: queries through a rank-r_q bottleneck (0: one d -> H·D projection)
    kv_lora_rank: int = 0  # MLA: r_kv, the width of the cached latent
    qk_rope_dim: int = 0  # MLA: the rotary part of each query/key head (the key's is shared by all heads)
    v_head_dim: int = 0  # MLA: each value head's width

    @property
    def moe_layers(self):
        """Layers whose MLP is a mixture of experts."""
        return self.n_layers - len(self.dense_layers) if self.n_experts else 0

    def is_dense(self, layer):
        """Whether layer `layer` has a dense MLP of width F rather than a mixture of experts."""
        return not self.n_experts or layer in self.dense_layers


class _Reader:
    """Typed reads of one config mapping and its overrides; every failure is a ConfigError naming the key."""

    def __init__(self, config, overrides):
        self.config = config
        self.overrides = overrides
        self.read = set()  # every key a read looked for, aliases included
        self.applied = {}  # {override key: the key it was read as}

    def raw(self, names, default=MISSING):
        """(the key read, its value): an override of any of `names` first, else the first of `names` the config holds, else (names[0], default)."""
        self.read.update(names)
        for name in names:
            if name in self.overrides:
                self.applied[name] = names[0]
                return name, self.overrides[name]
        for name in names:
            if name in self.config:
                return name, self.config[name]
        return names[0], default

    def unread(self, model_type):
        """The ConfigError for the first override no read looked for (a key this model_type does not read), or None."""
        for key in self.overrides:
            if key not in self.read:
                close = difflib.get_close_matches(key, sorted(self.read), n=1)
                hint = f'did you mean "{close[0]}"? ' if close else ""
                return ConfigError(f'key "{key}" (an override): a {model_type} config does not use it; {hint}'
                                   f"the count reads {', '.join(sorted(self.read))}")
        return None

    def integer(self, *names, low=1, default=MISSING, meaning="", nullable=False):
        """The first of `names` present (a name and its aliases), an int >= low; `default` when absent; None for null when nullable."""
        expected = f"{'a positive integer' if low == 1 else f'an integer >= {low}'}{f' ({meaning})' if meaning else ''}"
        if nullable:
            expected += " or null"
        name, value = self.raw(names)
        if value is MISSING:
            if default is MISSING:
                raise bad_key(name, expected)
            return default
        if value is None and nullable:
            return None
        if type(value) is not int or value < low:
            raise bad_key(name, expected, value)
        return value

    def boolean(self, name, default):
        _, value = self.raw([name], default)
        if type(value) is not bool:
            raise bad_key(name, "true or false", value)
        return value


def _divides(key, value, of_key, of):
    if of % value:
        raise bad_key(key, f"a divisor of {of_key} ({of})", value)


def model_from_config(config: Mapping[str, Any]) -> Model:
    """The Model a config.json-shaped mapping describes; ConfigError (one line) when it describes none."""
    return read_model(config)[0]


def read_model(config, overrides=None):
    """(the Model, {override key: the config key it replaced}) for `config` with `overrides` applied.

    An override replaces the key it names or the key it is an alias of (transformers' attribute_map:
    num_hidden_layers stands for GPT-2's n_layer); an override the model does not read is a ConfigError.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"the config: expected a JSON object of keys and values, got {_json(config)}")
    overrides = dict(overrides or {})
    if "model_type" in overrides:
        config = {**config, "model_type": overrides.pop("model_type")}
    model_type = config.get("model_type", MISSING)
    known = ", ".join(sorted(STYLES))
    if model_type is MISSING:
        raise bad_key("model_type", f"one of {known}")
    if model_type not in STYLES:
        raise bad_key("model_type", f"one of {known}", model_type)
    r = _Reader(_gemma3_text_config(config) if model_type == "gemma3" else config, overrides)
    style = STYLES[model_type]
    reader = {"gpt2": _gpt2, "mla": _mla}.get(style) or _MODERN.get(model_type, _llama)
    model = reader(r) if style == "gpt2" else reader(r, model_type)
    unread = r.unread(model_type)
    if unread:
        raise unread
    return model, r.applied


def _gpt2(r):
    # transformers' GPT2Config.attribute_map lets the Llama-style names stand in for GPT-2's own.
    d = r.integer("n_embd", "hidden_size", meaning="the model width d")
    heads = r.integer("n_head", "num_attention_heads", meaning="attention heads")
    _divides("n_head", heads, "n_embd", d)
    if r.boolean("add_cross_attention", False):
        raise bad_key("add_cross_attention", "false (a GPT-2 with cross-attention is an encoder-decoder's half, not counted here)", True)
    positions = r.integer("n_positions", "max_position_embeddings", meaning="the rows of the position table")
    # attention_bias is the lesson's switch (TinyGPT has none); transformers' GPT-2 ignores the key and always has them.
    bias = r.boolean("attention_bias", True)
    return Model(
        model_type="gpt2", style="gpt2",
        vocab=r.integer("vocab_size", meaning="the vocabulary V"),
        d_model=d,
        n_layers=r.integer("n_layer", "num_hidden_layers", low=0, meaning="blocks"),
        n_heads=heads, n_kv_heads=heads, d_head=d // heads,
        d_ff=r.integer("n_inner", default=None, nullable=True, meaning="the MLP width; null means 4·n_embd") or 4 * d,
        tied=r.boolean("tie_word_embeddings", True),
        positions=positions, context=positions,
        qkv_bias=bias, o_bias=bias,
    )


def _heads(r, d, *, kv_default, null_head_dim, divides, head_dim_required=False):
    """(H, H_kv, D) of a Llama-style config: head_dim absent (or null, where transformers allows it) means d / H.

    divides: H must divide d even where head_dim is given (transformers' LlamaConfig validates it).
    head_dim_required: transformers' default head_dim is some model's size (Gemma 3's 256, gpt-oss's 64).
    """
    heads = r.integer("num_attention_heads", meaning="query heads H")
    meaning = "each head's width; null means hidden_size / num_attention_heads" if null_head_dim else "each head's width"
    d_head = r.integer("head_dim", default=MISSING if head_dim_required else None, nullable=null_head_dim, meaning=meaning)
    if d_head is None or divides:
        _divides("num_attention_heads", heads, "hidden_size", d)
    if d_head is None:
        d_head = d // heads
    kv_heads = r.integer("num_key_value_heads", default=heads if kv_default else MISSING, meaning="key/value heads H_kv")
    _divides("num_key_value_heads", kv_heads, "num_attention_heads", heads)
    return heads, kv_heads, d_head


def _experts_per_token(r, n_experts, experts_key):
    k = r.integer("num_experts_per_tok", meaning="the experts each token uses, k")
    if k > n_experts:
        raise bad_key("num_experts_per_tok", f"at most {experts_key} ({n_experts})", k)
    return k


def _llama(r, model_type):
    d = r.integer("hidden_size", meaning="the model width d")
    # Llama defaults num_key_value_heads to the query heads; Mistral, Mixtral and Qwen2 default it to a size (8, 8, 32).
    # transformers' Qwen2 reads head_dim with getattr(config, "head_dim", d // H), so a null head_dim breaks it.
    heads, kv_heads, d_head = _heads(r, d, kv_default=model_type == "llama", null_head_dim=model_type != "qwen2", divides=model_type == "llama")
    d_ff = r.integer("intermediate_size", meaning="the MLP width F")
    fields = {}
    if model_type == "llama":  # the only one of the four whose biases are switches
        bias = r.boolean("attention_bias", False)
        fields.update(qkv_bias=bias, o_bias=bias, mlp_bias=r.boolean("mlp_bias", False))
    elif model_type == "qwen2":  # q, k and v always have biases; the output projection never does
        fields.update(qkv_bias=True)
    elif model_type == "mixtral":
        n_experts = r.integer("num_local_experts", "num_experts", meaning="experts per layer E")
        fields.update(n_experts=n_experts, experts_per_token=_experts_per_token(r, n_experts, "num_local_experts"), d_expert=d_ff)
        d_ff = 0  # every layer is a mixture: intermediate_size is each expert's width
    return Model(
        model_type=model_type, style="llama",
        vocab=r.integer("vocab_size", meaning="the vocabulary V"),
        d_model=d,
        n_layers=r.integer("num_hidden_layers", low=0, meaning="decoder layers L"),
        n_heads=heads, n_kv_heads=kv_heads, d_head=d_head, d_ff=d_ff,
        tied=r.boolean("tie_word_embeddings", False),
        context=r.integer("max_position_embeddings", default=None, meaning="the longest context"),
        **fields,
    )


def _gemma3_text_config(config):
    """The keys of a Gemma 3 multimodal config's text model, the part the card counts (no vision tower, no projector).

    The head's tying is the top level's tie_word_embeddings (Gemma3ForConditionalGeneration reads it there, default
    true); a text_config that says otherwise would make Gemma3ForCausalLM another model, and is refused.
    """
    text = config.get("text_config", MISSING)
    expected = "an object of the text model's keys (the card counts Gemma 3's text model)"
    if text is MISSING:
        raise bad_key("text_config", expected)
    if not isinstance(text, Mapping):
        raise bad_key("text_config", expected, text)
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise bad_key("text_config.model_type", '"gemma3_text"', text["model_type"])
    tied = config.get("tie_word_embeddings", True)
    if text.get("tie_word_embeddings", tied) != tied:
        expected = f"the top level's tie_word_embeddings ({json.dumps(tied)}), which Gemma3ForConditionalGeneration reads"
        raise bad_key("text_config.tie_word_embeddings", expected, text["tie_word_embeddings"])
    return {**text, "tie_word_embeddings": tied}


def _qwen3_moe(r, model_type):
    """Qwen3-MoE: QK-norm; layer i is a mixture when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers."""
    d = r.integer("hidden_size", meaning="the model width d")
    heads, kv_heads, d_head = _heads(r, d, kv_default=False, null_head_dim=False, divides=False)
    n_layers = r.integer("num_hidden_layers", low=0, meaning="decoder layers L")
    n_experts = r.integer("num_experts", "num_local_experts", meaning="experts per mixture layer E (a Qwen3-MoE without any is a dense Qwen3)")
    step = r.integer("decoder_sparse_step", default=1, meaning="every how many layers one is a mixture")
    _, only = r.raw(["mlp_only_layers"], [])
    if only is None:  # transformers reads null as []
        only = []
    if not isinstance(only, list) or any(type(i) is not int or i < 0 for i in only):
        raise bad_key("mlp_only_layers", "a list of layer indices (integers >= 0) that keep a dense MLP", only)
    dense = tuple(i for i in range(n_layers) if i in only or (i + 1) % step)
    bias = r.boolean("attention_bias", False)
    return Model(
        model_type=model_type, style="llama",
        vocab=r.integer("vocab_size", meaning="the vocabulary V"),
        d_model=d, n_layers=n_layers, n_heads=heads, n_kv_heads=kv_heads, d_head=d_head,
        d_ff=r.integer("intermediate_size", meaning="the dense layers' MLP width F") if dense else 0,
        tied=r.boolean("tie_word_embeddings", False),
        context=r.integer("max_position_embeddings", default=None, meaning="the longest context"),
        qkv_bias=bias, o_bias=bias,
        n_experts=n_experts, experts_per_token=_experts_per_token(r, n_experts, "num_experts"),
        d_expert=r.integer("moe_intermediate_size", meaning="each expert's width F_e"),
        dense_layers=dense, qk_norm=True,
    )


def _gemma3(r, model_type):
    """Gemma 3's text model: head_dim apart from hidden_size / heads, QK-norm, four norms per layer, a tied head by default."""
    d = r.integer("hidden_size", meaning="the model width d")
    # Gemma3TextConfig validates hidden_size % num_attention_heads; its head_dim (256) and num_key_value_heads (4) are sizes.
    heads, kv_heads, d_head = _heads(r, d, kv_default=False, null_head_dim=False, divides=True, head_dim_required=True)
    bias = r.boolean("attention_bias", False)
    return Model(
        model_type=model_type, style="llama",
        vocab=r.integer("vocab_size", default=GEMMA3_VOCAB, meaning="the vocabulary V"),
        d_model=d, n_layers=r.integer("num_hidden_layers", low=0, meaning="decoder layers L"),
        n_heads=heads, n_kv_heads=kv_heads, d_head=d_head,
        d_ff=r.integer("intermediate_size", meaning="the MLP width F"),
        tied=r.boolean("tie_word_embeddings", True),
        context=r.integer("max_position_embeddings", default=None, meaning="the longest context"),
        qkv_bias=bias, o_bias=bias,
        qk_norm=True, norms_per_layer=4,
    )


def _gpt_oss(r, model_type):
    """gpt-oss: biased attention with a sink logit per head; every layer a mixture whose router and experts have biases."""
    d = r.integer("hidden_size", meaning="the model width d")
    # GptOssConfig: head_dim null means d / H; absent, its default (64) is a size, so it is required.
    heads, kv_heads, d_head = _heads(r, d, kv_default=False, null_head_dim=True, divides=False, head_dim_required=True)
    n_experts = r.integer("num_local_experts", "num_experts", meaning="experts per layer E")
    k = _experts_per_token(r, n_experts, "num_local_experts")
    _, original = r.raw(["experts_per_token"])  # OpenAI's own key, which transformers does not read
    if original is not MISSING and original != k:
        raise bad_key("experts_per_token", f"equal to num_experts_per_tok ({k}), the one transformers reads", original)
    bias = r.boolean("attention_bias", True)  # on q, k, v and o
    return Model(
        model_type=model_type, style="llama",
        vocab=r.integer("vocab_size", meaning="the vocabulary V"),
        d_model=d, n_layers=r.integer("num_hidden_layers", low=0, meaning="decoder layers L"),
        n_heads=heads, n_kv_heads=kv_heads, d_head=d_head, d_ff=0,
        tied=r.boolean("tie_word_embeddings", False),
        context=r.integer("max_position_embeddings", default=None, meaning="the longest context"),
        qkv_bias=bias, o_bias=bias,
        n_experts=n_experts, experts_per_token=k,
        d_expert=r.integer("intermediate_size", meaning="each expert's width F_e"),
        moe_bias=True, sinks=True,
    )


_MODERN = {"qwen3_moe": _qwen3_moe, "gemma3_text": _gemma3, "gemma3": _gemma3, "gpt_oss": _gpt_oss}


def _mla(r, model_type):
    d = r.integer("hidden_size", meaning="the model width d")
    heads = r.integer("num_attention_heads", meaning="query heads H")
    if model_type == "deepseek_v2":  # transformers' DeepseekV2Config validates it, though no MLA weight depends on it
        _divides("num_attention_heads", heads, "hidden_size", d)
    kv_heads = r.integer("num_key_value_heads", default=heads, meaning="key/value heads")  # no weights depend on it in MLA
    n_layers = r.integer("num_hidden_layers", low=0, meaning="decoder layers L")
    experts_key = "n_routed_experts"
    alias = "num_experts" if model_type == "deepseek_v2" else "num_local_experts"  # transformers' attribute_map
    n_experts = r.integer(experts_key, alias, meaning="routed experts per mixture layer E")
    # Layers below first_k_dense_replace keep a dense MLP; a value past the last layer makes them all dense, as in transformers.
    # Its default is 0 in DeepSeek-V2's config and 3 (DeepSeek-V3's own value) in V3's, so there it is required.
    first = r.integer("first_k_dense_replace", low=0, default=0 if model_type == "deepseek_v2" else MISSING,
                      meaning="the first layers that keep a dense MLP")
    dense = tuple(range(min(first, n_layers)))
    _, freq = r.raw(["moe_layer_freq"], 1)
    if freq != 1 or type(freq) is not int:  # DeepSeek's own code skips layers; transformers builds a mixture in every one
        raise bad_key("moe_layer_freq", "1 (transformers builds a mixture in every layer after first_k_dense_replace)", freq)
    nope = r.integer("qk_nope_head_dim", meaning="the non-rotary part of each query/key head")
    rope = r.integer("qk_rope_head_dim", meaning="the rotary part of each query/key head")
    bias = r.boolean("attention_bias", False)
    return Model(
        model_type=model_type, style="mla",
        vocab=r.integer("vocab_size", meaning="the vocabulary V"),
        d_model=d, n_layers=n_layers, n_heads=heads, n_kv_heads=kv_heads, d_head=nope + rope,
        d_ff=r.integer("intermediate_size", meaning="the dense layers' MLP width F") if dense else 0,
        tied=r.boolean("tie_word_embeddings", False),
        context=r.integer("max_position_embeddings", default=None, meaning="the longest context"),
        qkv_bias=bias, o_bias=bias,
        mlp_bias=r.boolean("mlp_bias", False) if model_type == "deepseek_v2" else False,  # DeepSeek-V3's MLPs have no bias switch
        n_experts=n_experts,
        experts_per_token=_experts_per_token(r, n_experts, experts_key),
        d_expert=r.integer("moe_intermediate_size", meaning="each expert's width F_e"),
        n_shared=r.integer("n_shared_experts", low=0, meaning="shared experts S"),
        dense_layers=dense,
        q_lora_rank=r.integer("q_lora_rank", nullable=True, meaning="the query bottleneck; null for a full projection") or 0,
        kv_lora_rank=r.integer("kv_lora_rank", meaning="the cached latent's width"),
        qk_rope_dim=rope,
        v_head_dim=r.integer("v_head_dim", meaning="each value head's width"),
    )


# -- where configs come from ---------------------------------------------------------------

CONFIGS = Path(__file__).resolve().parent / "configs"
ConfigSource = Union[str, "os.PathLike[str]", Mapping[str, Any]]  # a known model's name, a config.json path or folder, or the config itself


def known_models() -> list[str]:
    """The shipped configs' names (the JSON files' stems), sorted: gpt2, llama-3-8b, mixtral-8x7b, ..."""
    return sorted(path.stem for path in CONFIGS.glob("*.json"))


def read_config(source: ConfigSource) -> dict[str, Any]:
    """A config mapping from a known model's name, a config.json path, or a folder holding one; ConfigError otherwise."""
    if isinstance(source, Mapping):
        return dict(source)
    name = str(source)
    path = CONFIGS / f"{name.lower()}.json"
    if not (path.is_file() and name.lower() in known_models()):
        path = Path(name)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{name}: not a known model ({', '.join(known_models())}) nor a config.json file or a folder holding one")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object of keys and values, got {_json(config)}")
    return config
