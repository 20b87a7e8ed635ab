"""Adapters written on the toolkit for public from-scratch decoders (issue 38): rasbt's Llama 3 with a growing KV cache and
minimind's tied-weight Llama, both vendored under tests/fixtures/decoders (see each NOTICE), pass what they provide."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the decoders are torch code")

from invariants import REGISTRY, all_invariants, load_implementation, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

all_invariants()
CI = profile_settings("ci")
DECODERS = Path(__file__).parent / "fixtures" / "decoders"
LAWS = ("decoding.decode_matches_full_forward", "decoding.cache_size_law", "llama.block_agrees_with_reference",
        "llama.logits_agree_with_reference", "rope.agrees_with_reference", "norms.rms_norm_agrees_with_reference")


def _impl(name, dtype):
    return load_implementation(str(DECODERS / name), dtype=dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["rasbt_llama3", "minimind"])
def test_a_toolkit_adapter_passes_its_decoding_and_agreement_laws(name, dtype):
    """A growing cache through tk.llama_decode, a block given the model's RoPE tables and mask, a tied head untied; float64 runs
    hold the float32 code to float32 rounding (COMPUTE_DTYPE) instead of skipping."""
    impl = _impl(name, dtype)
    outcomes = {law: run_invariant(REGISTRY[law], impl, settings=CI) for law in LAWS}
    assert all(o.passed for o in outcomes.values()), {n: o.reason for n, o in outcomes.items() if not o.passed}


def test_the_growing_cache_reports_padded_positions():
    import torch

    impl = _impl("rasbt_llama3", "float32")
    ids, params = torch.zeros(1, 4, dtype=torch.long), _params(torch)
    logits, held = impl.raw("llama_decode")(ids, params, 2, 1, 10_000.0, None, torch.tensor([2, 1, 1]))
    assert logits.shape == (1, 4, 3) and held.shape == (3, 1, 1, 4)  # (chunks, layers, kv heads, slots of the last)
    assert held[0, 0, 0].tolist() == [0, 1, -1, -1] and held[2, 0, 0].tolist() == [0, 1, 2, 3]


def _params(torch):
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    block = {"attn_norm": r(4), "ffn_norm": r(4), "W_q": r(4, 4), "W_k": r(4, 2), "W_v": r(4, 2), "W_o": r(4, 4), "W_gate": r(4, 3),
             "W_up": r(4, 3), "W_down": r(3, 4)}
    return {"embed": r(3, 4), "blocks": [block], "norm": r(4), "W_out": r(4, 3)}


def test_a_toolkit_error_is_never_read_as_a_refused_split():
    """keys() read with the wrong axes is the adapter's mistake: an error naming the toolkit, never advice to declare a chunk limit."""
    from invariants import Implementation
    from invariants.adapters import toolkit as tk

    adapter = _impl("rasbt_llama3", "float32")
    module = next(m for name, m in sys.modules.items() if name.startswith("_impl_") and hasattr(m, "_llama3") and hasattr(m, "KVCache"))
    wrong = tk.llama_decode(module._llama3, module.MODEL, lambda m, ids, at: m(ids, cache=m.kv), keys=lambda m: [k for k, _ in m.kv.get_all()],
                            axes="bhd")  # no slot axis
    members = {"llama_decode": staticmethod(wrong), "llama_logits": staticmethod(adapter.raw("llama_logits")), **adapter.declarations}
    impl = Implementation(type("wrong_axes", (), members), label="wrong axes", backend="torch", dtype="float32")
    outcome = run_invariant(REGISTRY["decoding.cache_size_law"], impl, settings=CI)
    assert outcome.status == "error" and "ToolkitError" in outcome.reason, outcome.reason
    assert "refused" not in outcome.reason and "declare" not in outcome.reason, outcome.reason
