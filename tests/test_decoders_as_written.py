"""Correct modern decoders as people write them (issue 26): preallocated and ring caches, float32 internals, a fixed RoPE base,
chunk limits. Each passes once it says what it is, and the same code with a real bug still fails."""

from __future__ import annotations

import math

import numpy as np
import pytest

import invariants.reference.numpy as rn
from invariants import REGISTRY, Implementation, all_invariants, run_invariant
from invariants.profiles import profile_settings
from invariants.protocol import ImplementationLoadError

all_invariants()
CI = profile_settings("ci")
DECODING = ("decoding.decode_matches_full_forward", "decoding.cache_size_law")


def _impl(label, dtype="float64", **members):
    namespace = type(label, (), {k: staticmethod(v) if callable(v) else v for k, v in members.items()})
    return Implementation(namespace, label=label, backend="numpy", dtype=dtype)


def _outcomes(impl, names):
    return {name: run_invariant(REGISTRY[name], impl, settings=CI) for name in names}


def _slot_decode(ids, params, n_heads, n_kv_heads, base, window, chunks, *, ring=False, one_position_per_chunk=False):
    """A Llama decoder on a cache allocated up front: T slots, or a ring of w slots (slot p % w); -> (logits, cache_positions)."""
    blocks, (B, T) = params["blocks"], ids.shape
    D = blocks[0]["W_q"].shape[1] // n_heads if blocks else 2
    S = window if ring and window is not None else T
    K = np.zeros((len(blocks), B, n_kv_heads, S, D), dtype=params["embed"].dtype)  # (L, B, H_kv, S, D), allocated up front
    V = np.zeros_like(K)
    held = np.full((len(blocks), S), -1)  # the position in each slot of each layer
    logits, table, start = [], [], 0
    for n in (int(c) for c in chunks):
        x, pos = params["embed"][ids[:, start : start + n]], np.arange(start, start + n)
        at = np.full(n, start) if one_position_per_chunk and start else pos  # after the prefill: a one-token step's position for all
        for layer, p in enumerate(blocks):
            h = rn.rms_norm(x, p["attn_norm"])
            q = rn.rope(rn.split_heads(h @ p["W_q"], n_heads), at, base)
            k, v = rn.rope(rn.split_heads(h @ p["W_k"], n_kv_heads), at, base), rn.split_heads(h @ p["W_v"], n_kv_heads)
            filled = held[layer] >= 0
            keys = np.concatenate([K[layer][:, :, filled], k], axis=2)  # (B, H_kv, S', D)
            values = np.concatenate([V[layer][:, :, filled], v], axis=2)
            key_pos = np.concatenate([held[layer][filled], pos])
            seen = key_pos[None, :] <= pos[:, None]
            if window is not None:
                seen &= key_pos[None, :] > pos[:, None] - window
            group = n_heads // n_kv_heads
            scores = q @ rn.repeat_kv(keys, group).swapaxes(-1, -2) / math.sqrt(D)
            heads = rn.masked_softmax(scores, np.broadcast_to(seen, scores.shape)) @ rn.repeat_kv(values, group)
            x = x + rn.merge_heads(heads) @ p["W_o"]
            x = x + rn.swiglu(rn.rms_norm(x, p["ffn_norm"]), p["W_gate"], p["W_up"], p["W_down"])
            last = pos[-S:]  # what fits in the slots
            K[layer][:, :, last % S], V[layer][:, :, last % S], held[layer][last % S] = k[:, :, -S:], v[:, :, -S:], last
        logits.append(rn.rms_norm(x, params["norm"]) @ params["W_out"])
        table.append(np.broadcast_to(held[:, None, :], (len(blocks), n_kv_heads, S)).copy())
        start += n
    return np.concatenate(logits, axis=1), np.stack(table)


def _decoder(label, *, ring=False, one_position_per_chunk=False, refuse_long_chunks=False, **declarations):
    def llama_decode(ids, params, n_heads, n_kv_heads, base, window, chunks):
        if refuse_long_chunks and window is not None and int(max(chunks)) > window:
            raise ValueError(f"a chunk of {int(max(chunks))} tokens is longer than the cache's {window} slots")
        return _slot_decode(ids, params, n_heads, n_kv_heads, base, window, chunks, ring=ring,
                            one_position_per_chunk=one_position_per_chunk)

    def llama_logits(ids, params, n_heads, n_kv_heads, base, window):
        return llama_decode(ids, params, n_heads, n_kv_heads, base, window, np.array([ids.shape[1]]))[0]

    return _impl(label, llama_decode=llama_decode, llama_logits=llama_logits, SLIDING_WINDOW=True, QKV_BIASES=False, **declarations)


@pytest.mark.parametrize("ring", [False, True], ids=["preallocated", "ring of w slots"])
def test_a_cache_allocated_up_front_passes_by_its_positions(ring):
    outcomes = _outcomes(_decoder("slots", ring=ring), DECODING)
    assert all(o.status == "passed" for o in outcomes.values()), {n: o.reason for n, o in outcomes.items()}


def test_the_cache_law_still_fails_the_three_bugs_it_exists_for():
    from invariants.mutants import all_mutants

    zoo = {m.name: m for m in all_mutants()}
    for name in ("decoder.cache_replaced", "decoder.cache_after_repeat_kv", "decoder.window_cache_keeps_too_little"):
        assert run_invariant(REGISTRY["decoding.cache_size_law"], zoo[name].implementation(), settings=CI).status == "failed", name


def test_a_cache_reported_by_its_size_is_still_read():
    def by_size(ids, params, n_heads, n_kv_heads, base, window, chunks):
        logits, _ = rn.llama_decode(ids, params, n_heads, n_kv_heads, base, window, chunks)
        blocks = params["blocks"]
        per_token = 2 * len(blocks) * ids.shape[0] * n_kv_heads * (blocks[0]["W_k"].shape[1] // n_kv_heads if blocks else 0)
        return logits, per_token * np.cumsum(chunks)

    assert _outcomes(_impl("sizes", llama_decode=by_size), ["decoding.cache_size_law"])["decoding.cache_size_law"].status == "passed"


def test_a_refused_chunk_is_a_refusal_and_declaring_it_narrows_the_draws():
    outcome = run_invariant(REGISTRY["decoding.cache_size_law"], _decoder("refuses"), settings=CI)
    assert outcome.status == "passed"  # the reference-style decoder takes any prefill
    refusing = _decoder("refuses", refuse_long_chunks=True)
    outcome = run_invariant(REGISTRY["decoding.cache_size_law"], refusing, settings=CI)
    assert outcome.status == "error" and outcome.reason.startswith("llama_decode refused chunks="), outcome.reason
    assert "CHUNKS_WITHIN_WINDOW" in outcome.reason
    declared = _decoder("declares", refuse_long_chunks=True, ring=True, CHUNKS_WITHIN_WINDOW=True)
    outcomes = _outcomes(declared, DECODING)
    assert all(o.status == "passed" for o in outcomes.values()), {n: o.reason for n, o in outcomes.items()}


def test_one_token_steps_pass_once_declared_and_a_multi_token_chunk_still_fails_undeclared():
    wrong_on_chunks = _decoder("one-token steps", one_position_per_chunk=True)
    assert run_invariant(REGISTRY["decoding.decode_matches_full_forward"], wrong_on_chunks, settings=CI).status == "failed"
    declared = _decoder("one-token steps", one_position_per_chunk=True, MAX_DECODE_CHUNK=1)
    outcomes = _outcomes(declared, DECODING)
    assert all(o.status == "passed" for o in outcomes.values()), {n: o.reason for n, o in outcomes.items()}


def _fixed_base_rope(x, positions, base):
    return rn.rope(x, positions, 10_000.0)  # θ hard-coded, the argument ignored


def test_a_fixed_rope_base_is_declared():
    assert run_invariant(REGISTRY["rope.agrees_with_reference"], _impl("fixed", rope=_fixed_base_rope), settings=CI).status == "failed"
    for name in ("rope.agrees_with_reference", "rope.pairing_anchor", "rope.relative_offsets"):
        assert run_invariant(REGISTRY[name], _impl("fixed", rope=_fixed_base_rope, ROPE_THETA=10_000.0), settings=CI).passed, name
    wrong = _impl("wrong", rope=_fixed_base_rope, ROPE_THETA=500_000.0)  # a wrong declaration fails
    assert run_invariant(REGISTRY["rope.agrees_with_reference"], wrong, settings=CI).status == "failed"
    with pytest.raises(ImplementationLoadError, match=r"ROPE_THETA = 100.0 is not allowed: expected a float from 10000.0"):
        _impl("small", rope=_fixed_base_rope, ROPE_THETA=100.0)


def _in_float32(fn):
    """fn computed on float32 copies of its floating arrays (params dicts and lists too), its answers cast back: x.float() ... .type_as(x)."""

    def leaves(value):
        if isinstance(value, dict):
            value = list(value.values())
        return [leaf for v in value for leaf in leaves(v)] if isinstance(value, (list, tuple)) else [value]

    def cast(value, to):
        if isinstance(value, (np.ndarray, np.floating)) and value.dtype.kind == "f":
            return value.astype(to)  # a float32 scalar (cross_entropy's answer) is cast back too
        if isinstance(value, dict):
            return {k: cast(v, to) for k, v in value.items()}
        return type(value)(cast(v, to) for v in value) if isinstance(value, (list, tuple)) else value

    def computed(*args, **options):
        dtype = next(leaf.dtype for leaf in leaves(args) if isinstance(leaf, np.ndarray) and leaf.dtype.kind == "f")
        return cast(fn(*cast(args, np.float32), **options), dtype)

    return computed


LLAMA = ("llama.residual_identity", "llama.causal_non_leakage", "llama.values_are_not_rotated", "llama.block_agrees_with_reference")


def _float32_internals(dtype, mutant=None, **declarations):
    """The reference (or a mutant of it, by name) whose RMSNorm and RoPE compute in float32 (x.float(), float32 tables), as the block uses them."""
    from invariants.mutants import Mutant, all_mutants

    module = Mutant("test.float32", "", "", "numpy", "rope", rn.rope).namespace() if mutant is None else \
        next(m for m in all_mutants() if m.name == mutant).namespace()
    module.rope, module.rms_norm = _in_float32(module.rope), _in_float32(module.rms_norm)
    for name, value in declarations.items():
        setattr(module, name, value)
    return Implementation(module, label="float32 internals", backend="numpy", dtype=dtype)


def test_float32_internals_fail_a_float64_run_undeclared_and_pass_it_at_float32_rounding_declared():
    names = [*(n for n in REGISTRY if n.startswith("rope.")), "norms.rms_norm_agrees_with_reference", *LLAMA, *DECODING]
    undeclared = _outcomes(_float32_internals("float64"), names)
    failed = {n for n, o in undeclared.items() if o.status == "failed"}  # float32 rounding held to float64 agreement, or exactness
    assert "its errors are of float32 rounding size" in undeclared["llama.block_agrees_with_reference"].reason
    assert {"rope.agrees_with_reference", "rope.position_zero_is_identity", "llama.block_agrees_with_reference"} <= failed, failed
    declared = _outcomes(_float32_internals("float64", COMPUTE_DTYPE="float32"), names)
    assert all(o.passed for o in declared.values()), {n: o.reason for n, o in declared.items() if not o.passed}  # run, none skipped
    in_float32 = _outcomes(_float32_internals("float32", COMPUTE_DTYPE="float32"), names)
    assert all(o.passed for o in in_float32.values()), {n: o.reason for n, o in in_float32.items() if not o.passed}


@pytest.mark.parametrize("mutant", ["decoder.window_trimmed_before_chunk_attends", "decoder.cache_replaced", "decoder.no_mask_when_window_covers"])
def test_a_window_or_cache_bug_in_float32_code_fails_a_float64_run_declared(mutant):
    """COMPUTE_DTYPE = "float32" holds a float64 run to float32 rounding, and skips nothing: the bug still fails it (issue 38)."""
    from invariants.mutants import all_mutants

    law = next(m for m in all_mutants() if m.name == mutant).killed_by
    outcome = run_invariant(REGISTRY[law], _float32_internals("float64", mutant, COMPUTE_DTYPE="float32"), settings=CI)
    assert outcome.status == "failed", (law, outcome.status, outcome.reason)


# The version-1 functions, each computed in float32 as a whole (the blocks' residual streams too: the exact residual identities
# then hold them to x rounded to float32, bitwise).
V1_IN_FLOAT32 = ("softmax", "cross_entropy", "layer_norm", "gelu", "attention", "feed_forward", "transformer_block", "gpt_logits",
                 "top_k_gates", "load_balancing_loss", "moe", "cross_attention", "decoder_block")


def _v1_float32_internals(**declarations):
    from invariants.mutants import Mutant

    module = Mutant("test.float32_v1", "", "", "numpy", "softmax", _in_float32(rn.softmax)).namespace()
    for name in V1_IN_FLOAT32:
        setattr(module, name, _in_float32(getattr(rn, name)))
    for name, value in declarations.items():
        setattr(module, name, value)
    return Implementation(module, label="v1 float32 internals", backend="numpy", dtype="float64")


def test_version_1_float32_internals_fail_undeclared_and_pass_declared():
    """Every law a float64 run of float32 internals fails undeclared runs declared, at float32 rounding, and passes; none is skipped."""
    laws = [inv.name for inv in REGISTRY.values() if "numpy" in inv.backends and set(inv.requires) <= set(V1_IN_FLOAT32)]
    undeclared = _outcomes(_v1_float32_internals(), laws)
    failed = {n for n, o in undeclared.items() if o.status == "failed"}
    assert {"attention.agrees_with_reference", "block.agrees_with_reference", "model.agrees_with_reference"} <= failed, failed
    declared = _v1_float32_internals(COMPUTE_DTYPE="float32")
    assert not [n for n in laws if REGISTRY[n].skip_reason(declared)]
    outcomes = _outcomes(declared, laws)
    assert all(o.passed for o in outcomes.values()), {n: o.reason for n, o in outcomes.items() if not o.passed}


def apply_rotary(x, positions, base=10_000.0):
    """The module's own RoPE (interleaved pairs, float32 tables), applied inside its forward."""
    import torch

    D = x.shape[-1]
    angles = positions.float()[:, None] * base ** (-torch.arange(0, D, 2).float() / D)  # (T, D/2), float32
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], D // 2, 2))
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)[:, None]).flatten(-2).type_as(x)


def _attention_module(torch, *, one_too_wide=False):
    class Attention(torch.nn.Module):
        """Meta-style attention: projections, RoPE, a preallocated cache written at start_pos, the mask built inside forward."""

        def __init__(self, n_heads, n_kv_heads, d_head, max_len, window):
            super().__init__()
            d = n_heads * d_head
            self.H, self.H_kv, self.D, self.window = n_heads, n_kv_heads, d_head, window
            self.wq, self.wo = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
            self.wk, self.wv = torch.nn.Linear(d, n_kv_heads * d_head, bias=False), torch.nn.Linear(d, n_kv_heads * d_head, bias=False)
            self.max_len = max_len

        def forward(self, x, start_pos):
            B, T, _ = x.shape
            if start_pos == 0:
                self.cache_k = x.new_zeros(B, self.max_len, self.H_kv, self.D)
                self.cache_v = x.new_zeros(B, self.max_len, self.H_kv, self.D)
            positions = torch.arange(start_pos, start_pos + T)
            q = apply_rotary(self.wq(x).view(B, T, self.H, self.D), positions)
            k = apply_rotary(self.wk(x).view(B, T, self.H_kv, self.D), positions)
            self.cache_k[:, start_pos : start_pos + T], self.cache_v[:, start_pos : start_pos + T] = k, self.wv(x).view(B, T, self.H_kv, self.D)
            keys = self.cache_k[:, : start_pos + T].repeat_interleave(self.H // self.H_kv, dim=2).transpose(1, 2)  # (B, H, S, D)
            values = self.cache_v[:, : start_pos + T].repeat_interleave(self.H // self.H_kv, dim=2).transpose(1, 2)
            scores = q.transpose(1, 2) @ keys.transpose(-1, -2) / math.sqrt(self.D)  # (B, H, T, S)
            key_pos = torch.arange(start_pos + T)
            hidden = key_pos[None, :] > positions[:, None]
            if self.window is not None:
                hidden |= key_pos[None, :] <= positions[:, None] - self.window - int(one_too_wide)  # one_too_wide: w + 1 keys
            weights = torch.softmax(scores.float().masked_fill(hidden, float("-inf")), dim=-1).type_as(q)
            return self.wo((weights @ values).transpose(1, 2).reshape(B, T, -1))

    return Attention


def _core_adapter(one_too_wide=False):
    """gqa_attention from a module whose core cannot be called alone: its q, k, v substituted, RoPE the identity, wo's input captured."""
    import sys
    from unittest import mock

    import torch

    from invariants.adapters import toolkit as tk

    Attention = _attention_module(torch, one_too_wide=one_too_wide)

    def gqa_attention(q, k, v, causal, key_mask, window):
        (B, H, T, D), (H_kv, S) = q.shape, k.shape[1:3]
        attn = Attention(H, H_kv, D, S, window).to(q.dtype)
        rows = lambda t: t.transpose(1, 2).reshape(B, t.shape[2], -1)  # noqa: E731 - (B, heads, n, D) -> (B, n, heads·D)
        with mock.patch.object(sys.modules[__name__], "apply_rotary", lambda x, positions: x), tk.capture(attn, "wo", inputs=True) as seen:
            for start, end in ((0, S - T), (S - T, S)) if S > T else ((0, S),):  # the cached keys' prefill, then the queries
                queries = q if end == S else q.new_zeros(B, H, end - start, D)
                with tk.substitute(attn, {"wq": rows(queries), "wk": rows(k[:, :, start:end]), "wv": rows(v[:, :, start:end])}):
                    attn(q.new_zeros(B, end - start, H * D), start)
        return seen[-1].reshape(B, T, H, D).transpose(1, 2)

    return gqa_attention


GQA_AND_MASKING = [n for n in REGISTRY if n.split(".")[0] in ("gqa", "masking")]


def _core(one_too_wide=False):
    members = dict(gqa_attention=_core_adapter(one_too_wide), ATTENTION_WEIGHTS=False, CAUSAL_ONLY=True, KEY_MASK=False)
    namespace = type("core", (), {k: staticmethod(v) if callable(v) else v for k, v in members.items()})
    return Implementation(namespace, label="core", backend="torch", dtype="float32")


def test_an_attention_core_that_cannot_be_called_alone_runs_the_gqa_and_masking_invariants():
    pytest.importorskip("torch")
    outcomes = _outcomes(_core(), GQA_AND_MASKING)
    ran = [n for n, o in outcomes.items() if o.status != "skipped"]
    assert all(outcomes[n].passed for n in ran), {n: o.reason for n, o in outcomes.items() if not o.passed and n in ran}
    assert {"gqa.agrees_with_reference", "masking.window_outside_keys_ignored", "masking.masks_compose_in_low_precision"} <= set(ran)
    assert all(outcomes[n].declared for n in GQA_AND_MASKING if n not in ran), {n: outcomes[n].reason for n in GQA_AND_MASKING}
    wide = _outcomes(_core(one_too_wide=True), ["gqa.agrees_with_reference", "masking.window_outside_keys_ignored"])
    assert all(o.status == "failed" for o in wide.values()), {n: o.reason for n, o in wide.items()}


def test_the_default_matrix_runs_the_masks_in_float16():
    """A -1e9 sentinel and summed finfo.min planes are bugs in float16 only: each default environment runs the masking laws there."""
    import configparser
    from pathlib import Path

    from invariants.mutants import all_mutants

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).parents[1] / "tox.ini")
    for env in (name.strip() for name in tox["tox"]["envlist"].split(",")):
        assert '--impl-dtype float16 -k "masking or gqa"' in tox[f"testenv:{env}"]["commands"], env
    masks = [m.name for m in all_mutants() if m.dtype == "float16" and m.killed_by.startswith("masking.")]  # what those runs kill
    assert {"decoder.minus_1e9_sentinel", "decoder.summed_finfo_min_masks"} <= set(masks), masks


def test_the_toolkit_runs_a_meta_style_core_through_its_own_cache():
    """tk.gqa_attention on the same module: its projections substituted, wo's input captured, its RoPE patched to the identity."""
    pytest.importorskip("torch")
    import sys
    from unittest import mock

    from invariants.adapters import toolkit as tk

    def forward(attn, x, positions):  # Meta's forward(x, start_pos); its RoPE is a module-level function, patched for the call
        with mock.patch.object(sys.modules[__name__], "apply_rotary", lambda x, positions: x):
            return attn(x, int(positions[0]))

    for one_too_wide, status in ((False, "passed"), (True, "failed")):
        Attention = _attention_module(__import__("torch"), one_too_wide=one_too_wide)
        build = lambda n_heads, n_kv_heads, d_head, max_len, window, made=Attention: made(n_heads, n_kv_heads, d_head, max_len, window)  # noqa: E731
        members = dict(gqa_attention=tk.gqa_attention(build, forward, q="wq", k="wk", v="wv", out="wo"),
                       ATTENTION_WEIGHTS=False, CAUSAL_ONLY=True, KEY_MASK=False)
        namespace = type("core", (), {k: staticmethod(v) if callable(v) else v for k, v in members.items()})
        impl = Implementation(namespace, label="core", backend="torch", dtype="float32")
        outcomes = _outcomes(impl, ["gqa.agrees_with_reference", "gqa.queries_shorter_than_keys", "masking.window_outside_keys_ignored"])
        assert outcomes["gqa.agrees_with_reference"].status == status, outcomes["gqa.agrees_with_reference"].reason
        assert outcomes["masking.window_outside_keys_ignored"].status == status
        assert outcomes["gqa.queries_shorter_than_keys"].passed, outcomes["gqa.queries_shorter_than_keys"].reason


def _plain_llama(torch):
    """A plain PyTorch Llama as people write it: nn.Linear projections, a KV cache allocated for the whole sequence at start 0, written at
    positions."""
    import invariants.reference.torch as rt

    class Block(torch.nn.Module):
        def __init__(self, d, H, H_kv, F, max_len, base, window):
            super().__init__()
            self.H, self.H_kv, self.D, self.base, self.window, self.max_len = H, H_kv, d // H, base, window, max_len
            self.attn_norm, self.ffn_norm = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.ones(d))
            shapes = ((d, d), (d, H_kv * self.D), (d, H_kv * self.D), (d, d))
            self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(i, o, bias=False) for i, o in shapes)
            self.w1, self.w3, self.w2 = (torch.nn.Linear(i, o, bias=False) for i, o in ((d, F), (d, F), (F, d)))
        def forward(self, x, positions):
            (B, n, _), h = x.shape, rt.rms_norm(x, self.attn_norm)
            if positions[0] == 0:  # a new sequence: its cache, (B, H_kv, S, D) each
                self.cache_k, self.cache_v = (x.new_zeros(B, self.H_kv, self.max_len, self.D) for _ in range(2))
            q = rt.rope(self.wq(h).view(B, n, self.H, self.D).transpose(1, 2), positions, self.base)
            self.cache_k[:, :, positions] = rt.rope(self.wk(h).view(B, n, self.H_kv, self.D).transpose(1, 2), positions, self.base)
            self.cache_v[:, :, positions] = self.wv(h).view(B, n, self.H_kv, self.D).transpose(1, 2)
            S = int(positions[-1]) + 1
            out, _ = rt.gqa_attention(q, self.cache_k[:, :, :S], self.cache_v[:, :, :S], True, None, self.window)
            x = x + self.wo(rt.merge_heads(out))
            h = rt.rms_norm(x, self.ffn_norm)
            return x + self.w2(torch.nn.functional.silu(self.w1(h)) * self.w3(h))

    class Llama(torch.nn.Module):
        def __init__(self, vocab, n_layers, *sizes):
            super().__init__()
            self.embed, self.norm = torch.nn.Embedding(vocab, sizes[0]), torch.nn.Parameter(torch.ones(sizes[0]))
            self.layers, self.out = torch.nn.ModuleList(Block(*sizes) for _ in range(n_layers)), torch.nn.Linear(sizes[0], vocab, bias=False)

        def forward(self, ids, positions):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x, positions)
            return self.out(rt.rms_norm(x, self.norm))

    return Llama


def test_the_toolkit_puts_a_plain_pytorch_llama_with_its_own_cache_behind_the_protocol():
    """tk.llama_logits and tk.llama_decode on _plain_llama (slots "whole"), and the same code storing keys per query head fails the cache law."""
    torch = pytest.importorskip("torch")
    from invariants.adapters import toolkit as tk

    Llama = _plain_llama(torch)
    BLOCK = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "wq.weight": tk.T("W_q"), "wk.weight": tk.T("W_k"), "wv.weight": tk.T("W_v"),
             "wo.weight": tk.T("W_o"), "w1.weight": tk.T("W_gate"), "w3.weight": tk.T("W_up"), "w2.weight": tk.T("W_down")}
    MODEL = {"embed.weight": "embed", "layers.{}.": tk.each("blocks", BLOCK), "norm": "norm", "out.weight": tk.T("W_out")}

    def build(vocab, n_layers, d_model, n_heads, n_kv_heads, d_ff, max_len, rope_base, window):
        return Llama(vocab, n_layers, d_model, n_heads, n_kv_heads, d_ff, max_len, rope_base, window)

    def keys(model):
        return [layer.cache_k for layer in model.layers]

    for per_query_head, status in ((False, "passed"), (True, "failed")):
        held = (lambda model: [k.repeat_interleave(2, dim=1) for k in keys(model)]) if per_query_head else keys  # noqa: E731, B023
        members = dict(llama_logits=tk.llama_logits(build, MODEL, lambda m, ids: m(ids, torch.arange(ids.shape[1]))),
                       llama_decode=tk.llama_decode(build, MODEL, lambda m, ids, at: m(ids, at), keys=held, slots="whole"), QKV_BIASES=False)
        namespace = type("plain", (), {k: staticmethod(v) if callable(v) else v for k, v in members.items()})
        impl = Implementation(namespace, label="plain", backend="torch", dtype="float64")
        outcomes = _outcomes(impl, [*DECODING, "llama.logits_agree_with_reference"])
        assert outcomes["decoding.cache_size_law"].status == status, outcomes["decoding.cache_size_law"].reason
        assert outcomes["llama.logits_agree_with_reference"].passed, outcomes["llama.logits_agree_with_reference"].reason
        assert per_query_head or outcomes["decoding.decode_matches_full_forward"].passed, outcomes["decoding.decode_matches_full_forward"].reason
