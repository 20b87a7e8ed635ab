"""The accounting from configs: the known figures, the laws of counting on drawn configs, the card, and its command line."""

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import invariants.accounting
from invariants.accounting import BITS, ConfigError, card, count, kv_values_per_token, model_from_config, param_count, read_config, tensor_shapes
from invariants.accounting.cli import main
from invariants.accounting.count import expert_params
from invariants.accounting.strategies import model_configs
from invariants.reference.counts import gpt_param_count
from invariants.strategies._validation import InvalidArgument
from invariants.strategies.params import gpt_configs, gpt_params

LAWS = settings(max_examples=200, deadline=None, database=None)

# name or (name, overrides): (total, active per token); transformers' counts on the meta device (tests/test_accounting_external.py).
KNOWN = {
    "llama-3-8b": (8_030_261_248, 8_030_261_248),
    "mistral-7b-v0.1": (7_241_732_096, 7_241_732_096),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),  # attention, 2 of 8 experts, router, norms, embeddings and head
    "qwen2-7b": (7_615_616_512, 7_615_616_512),
    "gpt2": (124_439_808, 124_439_808),
    "gpt2-medium": (354_823_168, 354_823_168),
    "gpt2-large": (774_030_080, 774_030_080),
    "gpt2-xl": (1_557_611_200, 1_557_611_200),
    "llama-3.2-1b": (1_235_814_400, 1_235_814_400),  # tied head
    "qwen2-0.5b": (494_032_768, 494_032_768),  # tied head
    "deepseek-v2-lite": (15_706_484_224, 2_661_150_208),
    "deepseek-v3": (671_026_404_352, 37_552_282_624),  # without the multi-token-prediction layer transformers does not build
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
    "gpt-oss-20b": (20_914_757_184, 4_187_440_704),
    "gpt-oss-120b": (116_829_156_672, 5_711_982_912),
    "gemma-3-1b": (999_885_952, 999_885_952),  # tied head
    "gemma-3-27b": (27_009_346_304, 27_009_346_304),  # the text model; tied head
    "tinygpt": (27_328, 27_328),  # the lesson's model
}


@pytest.mark.parametrize("name", KNOWN)
def test_known_models(name):
    total, active = KNOWN[name]
    c = param_count(name)
    assert (c.total, c.active) == (total, active)


@pytest.mark.parametrize("overrides, total", [
    ({"tie_word_embeddings": False}, 163_037_184),  # GPT-2 small with an untied head: 124,439,808 + V·d
    ({"attention_bias": False}, 124_402_944),  # the lesson's GPT-2 without attention biases
])
def test_gpt2_variants(overrides, total):
    assert param_count({**read_config("gpt2"), **overrides}).total == total


def test_every_shipped_config_is_a_known_figure():
    assert set(invariants.accounting.known_models()) == set(KNOWN)


def test_known_breakdowns():
    llama = param_count("llama-3-8b").parts
    assert llama == {"embeddings": 525_336_576, "attention": 1_342_177_280, "feed_forward": 5_637_144_576, "shared_experts": 0,
                     "experts": 0, "router": 0, "norms": 266_240, "head": 525_336_576}
    # Per Llama layer 2d² + 2d·(d·H_kv/H) + 3d·F + 2d; plus d for the final norm, V·d for the embeddings and again for the head.
    d, F, V, L, kv = 4096, 14_336, 128_256, 32, 4096 * 8 // 32
    assert sum(llama.values()) == L * (2 * d * d + 2 * d * kv + 3 * d * F + 2 * d) + d + 2 * V * d
    mixtral = param_count("mixtral-8x7b")
    assert mixtral.parts["router"] == 32 * 8 * 4096 and mixtral.parts["experts"] == 32 * 8 * 3 * 4096 * 14_336
    assert mixtral.active_parts["experts"] == mixtral.parts["experts"] // 4
    qwen = param_count("qwen2-7b").parts
    assert qwen["attention"] == 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3584 + 2 * 512)  # q, k, v biases; none on o


def test_non_embedding_leaves_out_the_tables_and_an_untied_head():
    assert param_count("gpt2").non_embedding == 124_439_808 - 50_257 * 768 - 1024 * 768  # Kaplan's N: no token or position table
    assert param_count("llama-3-8b").non_embedding == 8_030_261_248 - 2 * 128_256 * 4096


def test_kv_cache_bytes_per_token():
    bf16 = {name: card(name)["kv_cache"]["bytes_per_token"]["bfloat16"] for name in KNOWN}
    assert bf16["llama-3-8b"] == bf16["mistral-7b-v0.1"] == bf16["mixtral-8x7b"] == 2 * 32 * 8 * 128 * 2 == 131_072
    assert bf16["qwen2-7b"] == 2 * 28 * 4 * 128 * 2 == 57_344
    assert bf16["gpt2"] == 2 * 12 * 768 * 2 == 36_864
    assert bf16["deepseek-v2-lite"] == 27 * (512 + 64) * 2 == 31_104  # the latent, not 2·L·H·D
    assert card("llama-3-8b")["kv_cache"]["bytes_at_context"]["bfloat16"] == 131_072 * 8192  # 1 GiB at 8,192 tokens


def test_card_figures():
    data = card("mixtral-8x7b", tokens=10**12)
    n = 12_879_925_248
    assert data["flops"] == {"per_generated_token": 2 * n, "per_training_token": 6 * n, "training_tokens": 10**12, "training": 6 * n * 10**12}
    assert data["weights_bytes"] == {"float32": 4 * 46_702_792_704, "bfloat16": 2 * 46_702_792_704, "int8": 46_702_792_704, "4-bit": 23_351_396_352}
    assert json.loads(json.dumps(data)) == data


# -- laws on drawn configs -------------------------------------------------------------------


@LAWS
@given(model_configs())
def test_count_is_the_sum_of_the_tensors_by_part(config):
    """The closed-form count equals the sizes of the tensors the model is built from, part by part."""
    model = model_from_config(config)
    c = count(model)
    tensors = tensor_shapes(model)
    by_part = {part: sum(t.size for t in tensors if t.part == part) for part in invariants.accounting.PARTS}
    assert c.parts == by_part, config
    assert len({t.name for t in tensors}) == len(tensors)


@LAWS
@given(gpt_configs(min_vocab=1, max_vocab=40, max_max_len=12, min_layers=0, max_layers=3), st.data())
def test_gpt2_count_is_the_reference_params_tree(config, data):
    """For GPT-2 the count agrees with the reference's gpt_param_count and with the size of the params tree it runs on."""
    params = data.draw(gpt_params(config))
    tree = params["wte"].size + params["wpe"].size + params["lnf_g"].size + params["lnf_b"].size
    tree += sum(array.size for block in params["blocks"] for array in block.values())
    cfg = {"model_type": "gpt2", "vocab_size": config.vocab, "n_embd": config.d_model, "n_layer": config.n_layers,
           "n_head": config.n_heads, "n_positions": config.max_len, "attention_bias": config.attn_bias}
    total = param_count(cfg).total
    assert total == tree == gpt_param_count(config.vocab, config.d_model, config.n_layers, config.max_len, config.attn_bias)


@LAWS
@given(model_configs())
def test_untied_minus_tied_is_one_table(config):
    tied = param_count({**config, "tie_word_embeddings": True})
    untied = param_count({**config, "tie_word_embeddings": False})
    model = model_from_config(config)
    assert untied.total - tied.total == untied.active - tied.active == model.vocab * model.d_model
    assert untied.non_embedding == tied.non_embedding


@LAWS
@given(model_configs(model_types=("mixtral",)))
def test_mixture_minus_its_dense_twin_is_the_other_experts_and_the_router(config):
    """Mixtral minus Mistral of the same sizes (intermediate_size F): L·((E − 1)·3dF + E·d), the extra experts and the routers."""
    dense = {key: value for key, value in config.items() if key not in ("num_local_experts", "num_experts_per_tok")}
    m = model_from_config(config)
    E, L, d, F = m.n_experts, m.n_layers, m.d_model, m.d_expert
    gap = param_count(config).total - param_count({**dense, "model_type": "mistral"}).total
    assert gap == L * ((E - 1) * 3 * d * F + E * d)


@LAWS
@given(model_configs(model_types=("deepseek_v2", "deepseek_v3")))
def test_deepseek_total_grows_by_one_expert_and_a_router_column_per_expert(config):
    """With shared experts and dense first layers: E routed experts minus one routed expert is (E − 1)·(3d·F_e + d) per mixture layer."""
    m = model_from_config(config)
    one = model_from_config({**config, "n_routed_experts": 1, "num_experts_per_tok": 1})
    gap = count(m).total - count(one).total
    assert gap == m.moe_layers * (m.n_experts - 1) * (3 * m.d_model * m.d_expert + m.d_model)


@LAWS
@given(model_configs())
def test_active_is_at_most_total_and_equal_when_every_expert_is_chosen(config):
    m = model_from_config(config)
    c = count(m)
    assert c.active <= c.total
    assert c.total - c.active == m.moe_layers * (m.n_experts - m.experts_per_token) * expert_params(m)
    if m.n_experts:
        every = count(replace(m, experts_per_token=m.n_experts))
        assert every.active == every.total == c.total


@LAWS
@given(model_configs())
def test_card_bytes_and_compute(config):
    data = card(config, tokens=1000)
    total, active = data["parameters"]["total"], data["parameters"]["active"]
    assert data["weights_bytes"] == {"float32": 4 * total, "bfloat16": 2 * total, "int8": total, "4-bit": math.ceil(total / 2)}
    assert data["flops"]["per_generated_token"] == 2 * active and data["flops"]["training"] == 6 * active * 1000
    m = model_from_config(config)
    values = m.n_layers * (m.kv_lora_rank + m.qk_rope_dim) if m.style == "mla" else 2 * m.n_layers * m.n_kv_heads * m.d_head
    assert kv_values_per_token(m) == values
    assert data["kv_cache"]["bytes_per_token"] == {dtype: math.ceil(values * bits / 8) for dtype, bits in BITS.items()}


def test_model_configs_validates_its_arguments():
    with pytest.raises(InvalidArgument, match="model_types=.*must name some of"):
        model_configs(model_types=("bert",))
    with pytest.raises(InvalidArgument, match="max_layers=-1 must be at least 0"):
        model_configs(max_layers=-1)


# -- bad input: one line naming the key ------------------------------------------------------

LLAMA = read_config("llama-3-8b")
BAD = [
    ({"model_type": "bert"}, 'key "model_type": expected one of deepseek_v2, deepseek_v3, gemma3, gemma3_text, gpt2, gpt_oss, llama, mistral, '
                             'mixtral, qwen2, qwen3_moe, got "bert"'),
    ({"model_type": None}, 'key "model_type": expected one of'),
    ({"hidden_size": None}, 'key "hidden_size": expected a positive integer (the model width d), got null'),
    ({"hidden_size": "4096"}, 'key "hidden_size": expected a positive integer (the model width d), got "4096" (a string)'),
    ({"num_hidden_layers": 32.0}, 'key "num_hidden_layers": expected an integer >= 0 (decoder layers L), got 32.0 (a decimal number)'),
    ({"vocab_size": True}, 'key "vocab_size": expected a positive integer (the vocabulary V), got true (a boolean)'),
    ({"vocab_size": -3}, 'key "vocab_size": expected a positive integer (the vocabulary V), got -3'),
    ({"num_key_value_heads": 5}, 'key "num_key_value_heads": expected a divisor of num_attention_heads (32), got 5'),
    ({"num_attention_heads": 3}, 'key "num_attention_heads": expected a divisor of hidden_size (4096), got 3'),
    ({"tie_word_embeddings": "no"}, 'key "tie_word_embeddings": expected true or false, got "no" (a string)'),
    ({"attention_bias": 1}, 'key "attention_bias": expected true or false, got 1'),
    ({"head_dim": [128]}, 'key "head_dim": expected a positive integer (each head\'s width; null means hidden_size / num_attention_heads) '
                          'or null, got [128] (a list)'),
]


@pytest.mark.parametrize("change, message", BAD, ids=[next(iter(c)) + f"={c[next(iter(c))]!r}" for c, _ in BAD])
def test_bad_keys_get_one_line_naming_the_key(change, message):
    with pytest.raises(ConfigError) as info:
        model_from_config({**LLAMA, **change})
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize("model_type, drop, message", [
    ("llama-3-8b", "hidden_size", 'missing key "hidden_size": expected a positive integer (the model width d)'),
    ("mistral-7b-v0.1", "num_key_value_heads", 'missing key "num_key_value_heads": expected a positive integer (key/value heads H_kv)'),
    ("mixtral-8x7b", "num_local_experts", 'missing key "num_local_experts": expected a positive integer (experts per layer E)'),
    ("gpt2", "n_embd", 'missing key "n_embd": expected a positive integer (the model width d)'),
    ("deepseek-v2-lite", "q_lora_rank",
     'missing key "q_lora_rank": expected a positive integer (the query bottleneck; null for a full projection) or null'),
    ("deepseek-v2-lite", "n_shared_experts", 'missing key "n_shared_experts": expected an integer >= 0 (shared experts S)'),
    ("qwen2-7b", "model_type", 'missing key "model_type": expected one of'),
])
def test_missing_keys(model_type, drop, message):
    config = {k: v for k, v in read_config(model_type).items() if k != drop}
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        model_from_config(config)


def test_relations_between_keys():
    with pytest.raises(ConfigError, match=r'^key "num_experts_per_tok": expected at most num_local_experts \(8\), got 9$'):
        model_from_config({**read_config("mixtral-8x7b"), "num_experts_per_tok": 9})
    with pytest.raises(ConfigError, match=r'^key "moe_layer_freq": expected 1 \(transformers builds a mixture in every layer'):
        model_from_config({**read_config("deepseek-v2-lite"), "moe_layer_freq": 2})
    with pytest.raises(ConfigError, match=r'^key "n_head": expected a divisor of n_embd \(768\), got 7$'):
        model_from_config({**read_config("gpt2"), "n_head": 7})


def test_defaults_follow_transformers():
    llama = {k: v for k, v in LLAMA.items() if k not in ("num_key_value_heads", "tie_word_embeddings", "attention_bias", "mlp_bias")}
    m = model_from_config(llama)
    assert (m.n_kv_heads, m.tied, m.qkv_bias, m.mlp_bias, m.d_head) == (32, False, False, False, 128)
    gpt2 = model_from_config({"model_type": "gpt2", "vocab_size": 5, "hidden_size": 8, "num_hidden_layers": 1, "n_head": 2, "n_positions": 4})
    assert (gpt2.d_model, gpt2.n_layers, gpt2.d_ff, gpt2.tied) == (8, 1, 32, True)  # the attribute_map names; n_inner absent is 4d
    assert model_from_config({**read_config("deepseek-v2-lite"), "first_k_dense_replace": 99}).moe_layers == 0  # every layer dense


def test_read_config_sources(tmp_path):
    folder = tmp_path / "snapshot"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    assert read_config(folder) == read_config(folder / "config.json") == read_config("LLAMA-3-8B") == LLAMA
    (tmp_path / "broken.json").write_text('{"model_type": "llama",')
    (tmp_path / "list.json").write_text("[1, 2]")
    for path, message in [(tmp_path / "broken.json", "not valid JSON (Expecting property name enclosed in double quotes at line 1"),
                          (tmp_path / "list.json", "expected a JSON object of keys and values, got [1, 2] (a list)"),
                          (tmp_path / "none.json", "not a known model (deepseek-v2-lite, ")]:
        with pytest.raises(ConfigError, match=f"^{path}: " + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
            read_config(path)


# -- the command line ------------------------------------------------------------------------


def test_cli_table(capsys):
    assert main(["mixtral-8x7b", "--tokens", "2e12"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mixtral-8x7b: mixtral · V 32,000 · d 4,096 · L 32 · H 32, H_kv 8, D 128 · E 8, k 2, F_e 14,336 · untied head")
    for figure in ("46,702,792,704", "12,879,925,248", "93.41 GB", "131,072 bytes", "FLOPs to train on D = 2,000,000,000,000 tokens"):
        assert figure in out, figure


def test_cli_json_is_the_card(capsys):
    assert main(["gpt2", "--json", "--set", "tie_word_embeddings=false"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(card("gpt2", overrides={"tie_word_embeddings": False})))
    assert data["parameters"]["total"] == 163_037_184


@pytest.mark.parametrize("alias, key", [("num_hidden_layers", "n_layer"), ("hidden_size", "n_embd"), ("num_attention_heads", "n_head")])
def test_an_override_by_alias_replaces_the_key_it_stands_for(alias, key, capsys):
    """GPT-2 reads n_layer, n_embd and n_head; transformers' attribute_map names them as Llama does, and so may --set."""
    value = {"n_layer": 2, "n_embd": 384, "n_head": 6}[key]
    assert card("gpt2", overrides={alias: value}) == card("gpt2", overrides={key: value}) | {
        "overrides": [{"set": alias, "as": key, "value": value}]}
    assert main(["gpt2", "--set", f"{alias}={value}"]) == 0
    assert f"  with {key} = {value} (set as {alias})" in capsys.readouterr().out.splitlines()[1:3]


def test_cli_list(capsys):
    assert main(["--list"]) == 0
    assert capsys.readouterr().out.split() == invariants.accounting.known_models()


@pytest.mark.parametrize("args, message", [
    (["bert-base"], "invariants-card: bert-base: not a known model (deepseek-v2-lite,"),
    (["llama-3-8b", "--set", "hidden_size=4096.5"], 'invariants-card: llama-3-8b: key "hidden_size": expected a positive integer'),
    (["mixtral-8x7b", "--set", "num_local_experts=null"], 'invariants-card: mixtral-8x7b: key "num_local_experts": expected a positive integer'),
    (["gpt2", "--set", "model_type=t5"], 'invariants-card: gpt2: key "model_type": expected one of'),
    (["gpt2", "--set", "num_hiden_layers=2"], 'invariants-card: gpt2: key "num_hiden_layers" (an override): a gpt2 config does not use it; '
                                              'did you mean "num_hidden_layers"?'),
    (["llama-3-8b", "--set", "n_layer=2"], 'invariants-card: llama-3-8b: key "n_layer" (an override): a llama config does not use it'),
    (["gpt2", "--set", "num_hidden_layers=two"], 'invariants-card: gpt2: key "num_hidden_layers": expected an integer >= 0'),
])
def test_cli_bad_input_is_one_line_and_status_2(args, message, capsys):
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(message) and captured.err.count("\n") == 1, captured.err


def test_cli_missing_key_from_a_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA.items() if k != "num_hidden_layers"}))
    assert main([str(path)]) == 2
    assert capsys.readouterr().err == f'invariants-card: {path}: missing key "num_hidden_layers": expected an integer >= 0 (decoder layers L)\n'


def test_python_m_accounting_runs():
    done = subprocess.run([sys.executable, "-m", "invariants.accounting", "llama-3-8b"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "8,030,261,248" in done.stdout
    done = subprocess.run([sys.executable, "-m", "invariants.accounting", "--set", "x", "gpt2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
