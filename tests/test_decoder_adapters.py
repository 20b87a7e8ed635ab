"""The modern-decoder adapters (transformers' Llama, Mistral, Qwen2; torch's SDPA with enable_gqa) pass chosen invariants.

Few examples here; `tox -e external` runs the whole suite on each. Skipped where transformers is not installed.
"""

import pytest
from hypothesis import settings

pytest.importorskip("torch", reason="the adapters wrap torch code; torch is not installed")

from invariants import REGISTRY, all_invariants, load_implementation, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

all_invariants()
FEW = settings(max_examples=6, derandomize=True, database=None, deadline=None)

CHOSEN = {  # adapter: (dtype, invariants)
    "sdpa_gqa": ("float64", ("gqa.repeated_kv_heads", "gqa.queries_shorter_than_keys", "gqa.agrees_with_reference",
                             "masking.window_key_count", "masking.fully_masked_rows", "cross_attention.cross_agrees_with_reference")),
    "llama": ("float32", ("rope.pairing_anchor", "swiglu.agrees_with_reference", "llama.block_agrees_with_reference",
                          "llama.logits_agree_with_reference", "decoding.decode_matches_full_forward", "decoding.cache_size_law")),
    "mistral": ("float32", ("llama.block_agrees_with_reference", "decoding.decode_matches_full_forward", "decoding.cache_size_law")),
    "qwen2": ("float32", ("llama.block_agrees_with_reference", "decoding.decode_matches_full_forward")),
}
CASES = [(adapter, dtype, name) for adapter, (dtype, names) in CHOSEN.items() for name in names]


@pytest.mark.parametrize("adapter, dtype, name", CASES, ids=[f"{a}-{n}" for a, _, n in CASES])
def test_decoder_adapter_passes(adapter, dtype, name):
    if adapter != "sdpa_gqa":
        pytest.importorskip("transformers", reason="the transformers adapters need transformers (pip install -e '.[external]')")
    impl = load_implementation(f"invariants.adapters.{adapter}", dtype=dtype)
    outcome = run_invariant(REGISTRY[name], impl, settings=FEW)
    assert outcome.passed, outcome.report or outcome.reason


def test_each_transformers_adapter_declares_its_family_conventions():
    pytest.importorskip("transformers")
    expected = {
        "llama": {"ROPE_PAIRING": "half_split", "QKV_BIASES": True, "SLIDING_WINDOW": False},  # no window in transformers' Llama
        "mistral": {"ROPE_PAIRING": "half_split"},  # its sliding window is the protocol's: nothing to declare
        "qwen2": {"ROPE_PAIRING": "half_split", "QKV_BIASES": True},
    }
    for adapter, declarations in expected.items():
        assert load_implementation(f"invariants.adapters.{adapter}", dtype="float32").declarations == declarations, adapter


@pytest.mark.parametrize("adapter", ["mistral", "qwen2"])
def test_the_suite_finds_the_librarys_own_sliding_cache_at_window_one(adapter, monkeypatch):
    """transformers 5.24's sliding cache layer keeps every position at w = 1 (invariants/adapters/hf_decoder.decode_cache works round it)."""
    pytest.importorskip("transformers")
    from transformers import DynamicCache

    from invariants.adapters import hf_decoder

    impl = load_implementation(f"invariants.adapters.{adapter}", dtype="float32")
    monkeypatch.setattr(hf_decoder, "decode_cache", lambda config, window: DynamicCache(config=config))  # the library's own
    outcome = run_invariant(REGISTRY["decoding.decode_matches_full_forward"], impl, settings=profile_settings("ci"))
    # wrong logits, or a mask and a cache of different lengths that the library's attention refuses (RuntimeError)
    assert outcome.status in ("failed", "error") and "window=1," in outcome.report, outcome.report or outcome.reason


PUBLIC = {  # adapter: (the package it wraps, the invariants run here in float32, with few examples; issue 26)
    "torchtune_llama3": ("torchtune", ("rope.agrees_with_reference", "swiglu.agrees_with_reference", "llama.block_agrees_with_reference",
                                       "llama.logits_agree_with_reference", "decoding.decode_matches_full_forward", "decoding.cache_size_law",
                                       "gqa.agrees_with_reference")),
    "olmo_core": ("olmo_core", ("rope.agrees_with_reference", "rope.position_zero_is_identity", "swiglu.agrees_with_reference",
                                "llama.block_agrees_with_reference", "llama.logits_agree_with_reference", "gqa.agrees_with_reference",
                                "masking.window_outside_keys_ignored")),
    "nanochat": ("nanochat", ("rope.agrees_with_reference", "rope.pairing_anchor", "gqa.agrees_with_reference",
                              "gqa.queries_shorter_than_keys", "masking.window_outside_keys_ignored")),
}
PUBLIC_CASES = [(adapter, name) for adapter, (_, names) in PUBLIC.items() for name in names]


@pytest.mark.parametrize("adapter, name", PUBLIC_CASES, ids=[f"{a}-{n}" for a, n in PUBLIC_CASES])
def test_public_decoder_adapter_passes(adapter, name):
    package = PUBLIC[adapter][0]
    reason = f"invariants.adapters.{adapter} wraps {package}, which is not installed (docs/adapters.md says how to run it)"
    pytest.importorskip(package, reason=reason)
    outcome = run_invariant(REGISTRY[name], load_implementation(f"invariants.adapters.{adapter}", dtype="float32"), settings=FEW)
    assert outcome.passed, outcome.report or outcome.reason
