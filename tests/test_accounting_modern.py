"""DeepSeek-V3, Qwen3-MoE, Gemma 3 and gpt-oss: the card's counts against transformers' own, and active parameters per token.

transformers builds each published config (invariants/accounting/configs) and drawn small ones on the meta device
(no download, no memory), and counts them with num_parameters() (a tied head once). Those tests skip with the
reason where transformers is not installed; the model-card comparisons and the bad keys run everywhere.
"""

import pytest
from hypothesis import HealthCheck, given, settings

from invariants.accounting import ConfigError, card, count, format_card, model_from_config, param_count, read_config, tensor_shapes
from invariants.accounting.count import expert_params
from invariants.accounting.strategies import model_configs

try:
    import torch
    import transformers
except ImportError:  # the comparisons skip; the rest runs
    transformers = None
else:
    transformers.logging.set_verbosity_error()
needs_transformers = pytest.mark.skipif(transformers is None, reason="builds transformers' own models; torch or transformers is not installed "
                                                                     "(pip install -e '.[external]')")

MODERN = ("deepseek_v3", "qwen3_moe", "gemma3_text", "gemma3", "gpt_oss")
PUBLISHED = ("deepseek-v3", "qwen3-30b-a3b", "gemma-3-1b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b")
COMPARED = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


VISION = ("model.vision_tower.", "model.multi_modal_projector.")


def build(config):
    """transformers' model for a config.json mapping, on the meta device (Gemma 3's: the multimodal model)."""
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))


def text_parameters(config):
    """{name: parameter} of the text model transformers builds from config, a tied head once.

    Gemma 3's multimodal config: Gemma3ForConditionalGeneration's parameters less the vision tower and the projector,
    named as Gemma3ForCausalLM names them.
    """
    params = dict(build(config).named_parameters())
    if config["model_type"] != "gemma3":
        return params
    return {name.replace("model.language_model.", "model."): p for name, p in params.items() if not name.startswith(VISION)}


def size(params):
    return sum(p.numel() for p in params.values())


@needs_transformers
@pytest.mark.parametrize("name", PUBLISHED)
def test_published_totals_are_transformers_counts(name):
    config = read_config(name)
    text_config = transformers.AutoConfig.for_model(**config).get_text_config()  # Gemma 3's: what Gemma3ForCausalLM is built from
    with torch.device("meta"):
        text_model = transformers.AutoModelForCausalLM.from_config(text_config)
    assert param_count(name).total == text_model.num_parameters() == size(text_parameters(config))


@needs_transformers
def test_gemma3_card_is_the_multimodal_model_less_its_vision_tower():
    """AutoModelForCausalLM builds Gemma 3's multimodal model; the card counts its text part, 27,009,346,304."""
    full = build(read_config("gemma-3-27b"))
    vision = sum(p.numel() for name, p in full.named_parameters() if name.startswith(VISION))
    assert (full.num_parameters(), vision) == (27_432_406_640, 416_866_032 + 6_194_304)  # the SigLIP tower and the projector
    assert full.num_parameters() - vision == param_count("gemma-3-27b").total == 27_009_346_304


@needs_transformers
def test_gemma3_head_is_tied_as_the_top_level_says():
    """Gemma3ForConditionalGeneration reads tie_word_embeddings at the top level, not in text_config: untied, the head is V·d more."""
    config = {**read_config("gemma-3-27b"), "tie_word_embeddings": False}
    config["text_config"] = {**config["text_config"], "num_hidden_layers": 1}
    c = param_count(config)
    assert c.parts["head"] == 262_208 * 5376 and c.total == size(text_parameters(config))


@needs_transformers
def test_deepseek_v3_builds_no_multi_token_prediction_layer_and_its_router_bias_is_a_buffer():
    config = {**read_config("deepseek-v3"), "num_nextn_predict_layers": 1}  # the published config's key: one MTP module, 14B more
    model = build(config)
    assert model.num_parameters() == param_count("deepseek-v3").total
    assert not any(name.startswith("model.layers.61.") for name, _ in model.named_parameters())
    biases = [b for name, b in model.named_buffers() if name.endswith("e_score_correction_bias")]
    assert [b.numel() for b in biases] == [256] * 58  # one per mixture layer; not a parameter, not counted


@needs_transformers
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")  # a DeepSeek layer with no shared experts
@COMPARED
@given(model_configs(model_types=MODERN, lesson_keys=False))
def test_drawn_configs_are_the_tensors_and_count_transformers_builds(config):
    """Every tensor named and shaped as transformers builds it, defaults included, so the totals agree."""
    params = text_parameters(config)
    m = model_from_config(config)
    assert {t.name: t.shape for t in tensor_shapes(m)} == {name: tuple(p.shape) for name, p in params.items()}, config
    assert count(m).total == size(params)


@needs_transformers
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")  # a DeepSeek layer with no shared experts
@COMPARED
@given(model_configs(model_types=MODERN, lesson_keys=False))
def test_active_is_k_of_the_e_experts_in_every_stacked_expert_tensor(config):
    """Active per token: every parameter transformers builds, each routed-expert tensor (E, ...) counted for k of its E experts."""
    m = model_from_config(config)
    E, k = m.n_experts, m.experts_per_token
    active = sum(p.numel() * k // E if ".mlp.experts." in name else p.numel() for name, p in text_parameters(config).items())
    assert count(m).active == active, config


@given(model_configs(model_types=MODERN))
@settings(max_examples=100, deadline=None, database=None)
def test_active_is_total_less_the_experts_a_token_skips(config):
    """total − active = L_moe·(E − k)·P_expert, with P_expert = 3·d·F_e, and 2·F_e + d more for gpt-oss's expert biases."""
    m = model_from_config(config)
    c = count(m)
    assert c.total - c.active == m.moe_layers * (m.n_experts - m.experts_per_token) * expert_params(m)
    assert {part: c.parts[part] - c.active_parts[part] for part in c.parts if c.parts[part] != c.active_parts[part]} in (
        {}, {"experts": c.total - c.active})


# What each model card says, and which of the card's figures it reads as, to its last digit: the active count ("all":
# every table whole, as the card counts), or that less the input table V·d ("no input table"), truncated or rounded.
MODEL_CARDS = [
    # deepseek-ai/DeepSeek-V3 model card and arXiv:2412.19437: "671B total parameters with 37B activated for each token"
    ("deepseek-v3", "671B", "37B", {"all, truncated", "no input table, rounded"}),
    # Qwen/Qwen3-30B-A3B model card: "Number of Parameters: 30.5B in total and 3.3B activated"
    ("qwen3-30b-a3b", "30.5B", "3.3B", {"all, truncated"}),
    # deepseek-ai/DeepSeek-V2-Lite model card: "15.7B total parameters, of which 2.4B are activated for each token"
    ("deepseek-v2-lite", "15.7B", "2.4B", {"no input table, truncated"}),
    # openai/gpt-oss-120b model card: "117B parameters with 5.1B active parameters"
    ("gpt-oss-120b", "117B", "5.1B", {"no input table, truncated", "no input table, rounded"}),
    # openai/gpt-oss-20b model card: "21B parameters with 3.6B active parameters"
    ("gpt-oss-20b", "21B", "3.6B", {"no input table, truncated", "no input table, rounded"}),
]


def quoted(figure):
    """'3.3B' as (33, 10**8): the figure in units of its last digit."""
    whole, _, decimals = figure.removesuffix("B").partition(".")
    return int(whole + decimals), 10 ** (9 - len(decimals))


@pytest.mark.parametrize("name, total, active, readings", MODEL_CARDS, ids=[row[0] for row in MODEL_CARDS])
def test_model_card_figures(name, total, active, readings):
    c = param_count(name)
    m = model_from_config(read_config(name))
    value, unit = quoted(total)
    assert round(c.total / unit) == value
    value, unit = quoted(active)
    figures = {"all": c.active, "no input table": c.active - m.vocab * m.d_model}
    found = {f"{kind}, {how}" for kind, n in figures.items() for how, reading in (("truncated", n // unit), ("rounded", round(n / unit)))
             if reading == value}
    assert found == readings


def test_qwen3_non_embedding_figure():
    assert round(param_count("qwen3-30b-a3b").non_embedding / 10**8) == 299  # the model card's "29.9B (non-embedding)"


def test_mixture_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    qwen = read_config("qwen3-30b-a3b")
    m = model_from_config({**qwen, "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3, 9]})
    assert (m.dense_layers, m.moe_layers) == ((0, 2, 3, 4), 2)  # layer i is a mixture when (i + 1) % 2 == 0 and i is not in [3, 9]
    assert card({**qwen, "num_hidden_layers": 6, "decoder_sparse_step": 2})["parameters"]["by_part"]["feed_forward"] == 3 * 3 * 2048 * 6144


def test_the_card_says_what_it_counts():
    assert "the text model only: the vision tower and its projector are not counted" in card_line("gemma-3-27b")
    assert "QK-norm · 4 norms per layer · tied head" in card_line("gemma-3-1b")
    assert "attention sinks · router and expert biases" in card_line("gpt-oss-120b")
    assert "E 128, k 8, F_e 768 · QK-norm" in card_line("qwen3-30b-a3b")


def card_line(name):
    return format_card(card(name)).splitlines()[0]


GEMMA = read_config("gemma-3-27b")
OSS = read_config("gpt-oss-20b")
QWEN = read_config("qwen3-30b-a3b")
BAD = [
    ({k: v for k, v in GEMMA.items() if k != "text_config"}, 'missing key "text_config": expected an object of the text model\'s keys'),
    ({**GEMMA, "text_config": 5}, 'key "text_config": expected an object of the text model\'s keys (the card counts Gemma 3\'s text model), got 5'),
    ({**GEMMA, "text_config": {**GEMMA["text_config"], "model_type": "llama"}}, 'key "text_config.model_type": expected "gemma3_text", got "llama"'),
    ({**GEMMA, "text_config": {**GEMMA["text_config"], "tie_word_embeddings": False}},
     'key "text_config.tie_word_embeddings": expected the top level\'s tie_word_embeddings (true), which Gemma3ForConditionalGeneration reads'),
    ({**GEMMA, "text_config": {k: v for k, v in GEMMA["text_config"].items() if k != "head_dim"}}, 'missing key "head_dim"'),
    ({**OSS, "experts_per_token": 2}, 'key "experts_per_token": expected equal to num_experts_per_tok (4), the one transformers reads, got 2'),
    ({k: v for k, v in OSS.items() if k != "head_dim"}, 'missing key "head_dim"'),
    ({**QWEN, "mlp_only_layers": "0"}, 'key "mlp_only_layers": expected a list of layer indices (integers >= 0) that keep a dense MLP, got "0"'),
    ({**QWEN, "mlp_only_layers": [-1]}, 'key "mlp_only_layers": expected a list of layer indices'),
    ({**QWEN, "num_experts": 0}, 'key "num_experts": expected a positive integer (experts per mixture layer E (a Qwen3-MoE without any is a dense'),
    ({**QWEN, "mlp_only_layers": [0]} | {"intermediate_size": None}, 'key "intermediate_size": expected a positive integer'),
]


@pytest.mark.parametrize("config, message", BAD)
def test_bad_keys_get_one_line_naming_the_key(config, message):
    with pytest.raises(ConfigError) as info:
        model_from_config(config)
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


def test_overrides_of_a_gemma3_config_are_its_text_keys():
    data = card("gemma-3-27b", overrides={"num_hidden_layers": 2, "tie_word_embeddings": False})
    assert data["architecture"]["n_layers"] == 2 and data["parameters"]["by_part"]["head"] == 262_208 * 5376
