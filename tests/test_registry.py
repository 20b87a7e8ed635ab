"""The registry finds the component modules by what they declare (HOLDS, LESSON); drawers and budgets come from the components and entries."""

import importlib

import pytest

from invariants.inputs import VALID_INPUTS, valid_inputs
from invariants.protocol import FUNCTIONS, ROUNDINGS
from invariants.registry import COMPONENTS, all_invariants, discover_components

all_invariants()  # at collection: an inline pytester run in another test module unloads what it imported, and a re-import registers twice

# The lesson order before discovery: test ids, the kill matrix's first failure and the diagnosis depend on it.
LESSON_ORDER = ("softmax", "norms", "activation", "attention", "feed_forward", "block", "model", "moe", "routing", "scores", "rope",
                "rope_scaling", "gemma", "gqa", "masking", "swiglu", "llama", "decoding", "layer_types", "streaming",
                "qk_norm", "mla", "cross_attention",
                "counts", "course", "dtypes", "shapes", "finite")


def test_components_are_discovered_in_the_lesson_order():
    assert tuple(COMPONENTS) == LESSON_ORDER
    lessons = [importlib.import_module(f"invariants.laws.{component}").LESSON for component in COMPONENTS]
    assert lessons == sorted(lessons) and len(set(lessons)) == len(lessons)
    for component, holds in COMPONENTS.items():
        assert importlib.import_module(f"invariants.laws.{component}").HOLDS == holds, component


def test_a_new_component_goes_where_its_lesson_says(tmp_path):
    (tmp_path / "first.py").write_text('LESSON = 10\nHOLDS = ("softmax",)\n')
    (tmp_path / "later.py").write_text('"""A component."""\n\nLESSON = 15\nHOLDS = ("rope", "gqa_attention")\n')
    (tmp_path / "last.py").write_text('LESSON = 20\nHOLDS = ()\n')
    (tmp_path / "helper.py").write_text('"""No HOLDS: not a component."""\n')
    assert discover_components(tmp_path) == {"first": ("softmax",), "later": ("rope", "gqa_attention"), "last": ()}


@pytest.mark.parametrize("modules, message", [
    ({"one.py": 'HOLDS = ("softmax",)\n'}, "must declare both HOLDS and LESSON"),
    ({"one.py": 'LESSON = 1\nHOLDS = ()\n', "two.py": 'LESSON = 1\nHOLDS = ()\n'}, "the same LESSON"),
])
def test_discovery_refuses_an_ambiguous_component(tmp_path, modules, message):
    for name, text in modules.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        discover_components(tmp_path)


def test_a_component_registers_its_own_drawer_once():
    assert VALID_INPUTS["qk_norm_attention"].__module__ == "invariants.laws.qk_norm"
    with pytest.raises(ValueError, match="registered twice"):
        valid_inputs("qk_norm_attention")(lambda impl, case: ())


def test_rounding_budgets_are_the_entries():
    assert ROUNDINGS == {name: entry.roundings for name, entry in FUNCTIONS.items() if entry.roundings is not None}
    assert ROUNDINGS == {"attention": 8, "rope": 4, "gqa_attention": 8, "swiglu": 4, "llama_block": 8, "cross_attention": 8, "qk_norm_attention": 8,
                         "mla_attention": 8, "mla_decode": 8, "partial_rope": 4, "alibi_attention": 8, "softcap": 3, "softcapped_attention": 11,
                         "sink_attention": 8, "geglu": 4, "gemma_rms_norm": 2, "streaming_attention": 8,
                         "streaming_decode": 8}


def test_every_entry_says_its_version():
    assert {name for name, entry in FUNCTIONS.items() if entry.version == 2} == {
        "rope", "gqa_attention", "swiglu", "llama_block", "llama_logits", "llama_decode", "cross_attention", "decoder_block", "qk_norm_attention",
        "grouped_top_k_gates", "softmax_top_k_gates", "expert_bias_update", "rope_frequencies", "softmax_scale", "partial_rope",
        "alibi_slopes", "alibi_attention", "softcap", "softcapped_attention", "sink_attention", "hybrid_logits", "hybrid_decode",
        "mla_attention", "mla_decode", "geglu", "scaled_embedding", "gemma_rms_norm", "streaming_attention", "streaming_decode"}
    assert all(entry.version in (1, 2) and entry.arguments for entry in FUNCTIONS.values())


HINT_LIMIT = 400  # characters: a hint names the likely bug; explanations shared by many hints live in the docs (docs/dtypes.md)


def test_every_hint_is_short():
    long = {inv.name: len(inv.hint) for inv in all_invariants() if len(inv.hint) > HINT_LIMIT}
    assert long == {}, long
