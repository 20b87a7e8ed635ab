"""Modern-decoder bugs written without sight of the invariants' hints: the held-out set the likely-bug line is measured on (issue 26 §4).

Each is the numpy reference with one function replaced, as a user's own Llama would be wrong: the
block computes its own RMSNorm and its own attention mask, so the protocol's rms_norm and gqa_attention
stay correct and only the block, the model and the decode see the bug. Each bug's `cause` is its coarse
class (norm, bias, window, float32, refusal: issue 26); FIRST_SET_KINDS gives its kind of bug in KINDS,
the vocabulary issue 35 grades the likely-bug line in: right when the first kind the line names is the
bug's, and how many kinds it names besides. Written with the bugs, before any tuning.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import invariants.reference.numpy as ref
from invariants.mutants import Mutant


@dataclass(frozen=True)
class HeldOut(Mutant):
    """A held-out bug: a Mutant plus its cause (the first set's coarse class; the second set's kind in KINDS)."""

    cause: str = ""


HELD_OUT: dict[str, HeldOut] = {}


def held_out(slug, function, *, replaces, bug, cause):
    """Register `function` as the held-out bug heldout.<slug> (killed_by is left empty: no hint was written for it)."""
    HELD_OUT[f"heldout.{slug}"] = HeldOut(f"heldout.{slug}", bug, "", "numpy", replaces, function, cause=cause)


def llama_block_with_norm(norm):
    """The reference's llama_block_step with its two RMSNorms computed by `norm(x, gain, eps)`."""

    def step(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=ref.EPS):
        p = params
        attended, cache = ref.llama_attention(norm(x, p["attn_norm"], eps), p, n_heads, n_kv_heads, positions, rope_base, window, cache,
                                              pairing=pairing)
        h = x + attended
        return h + ref.swiglu(norm(h, p["ffn_norm"], eps), p["W_gate"], p["W_up"], p["W_down"]), cache

    return step


def _eps_outside_root(x, gain, eps):
    return x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + eps) * gain  # BUG: sqrt(ms) + eps


def _one_plus_gain(x, gain, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * (1 + gain)  # BUG: Gemma's (1 + g) on Llama weights


def _centred(x, gain, eps):
    centred = x - x.mean(axis=-1, keepdims=True)  # BUG: RMSNorm does not centre
    return centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps) * gain


def _float32_norm(x, gain, eps):
    x32 = x.astype(np.float32)  # by design, as Llama's x.float(): correct, but float32 rounding in a float64 run
    return (x32 / np.sqrt((x32 * x32).mean(axis=-1, keepdims=True) + np.float32(eps))).astype(x.dtype) * gain


held_out("rms_eps_outside_root", llama_block_with_norm(_eps_outside_root), replaces="llama_block_step",
         bug="the block's RMSNorm adds eps outside the root: x / (√ms + eps)", cause="norm")
held_out("rms_one_plus_gain", llama_block_with_norm(_one_plus_gain), replaces="llama_block_step",
         bug="the block's RMSNorm scales by (1 + gain)", cause="norm")
held_out("rms_centred", llama_block_with_norm(_centred), replaces="llama_block_step",
         bug="the block's RMSNorm centres the row (a LayerNorm without bias)", cause="norm")
held_out("rms_in_float32", llama_block_with_norm(_float32_norm), replaces="llama_block_step",
         bug="the block computes RMSNorm in float32 (correct code, float64 run)", cause="float32")


def _attention(bias_q, bias_k, bias_v, *, prefill_window=lambda window: window):
    """The reference's llama_attention with the biases read by name (None: dropped) and the prefill's window changed."""

    def attend(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
        q = ref.split_heads(ref.project(x, p["W_q"], p.get(bias_q) if bias_q else None), n_heads)
        k = ref.split_heads(ref.project(x, p["W_k"], p.get(bias_k) if bias_k else None), n_kv_heads)
        v = ref.split_heads(ref.project(x, p["W_v"], p.get(bias_v) if bias_v else None), n_kv_heads)
        q, k = ref.rope(q, positions, rope_base, pairing=pairing), ref.rope(k, positions, rope_base, pairing=pairing)
        held = np.asarray(positions)
        if cache is not None:
            k, v = np.concatenate([cache[0], k], axis=2), np.concatenate([cache[1], v], axis=2)
            held = np.concatenate([cache[2], held])
        w = prefill_window(window) if cache is None and window is not None else window
        heads, _ = ref.gqa_attention(q, k, v, True, None, w)
        return ref.merge_heads(heads) @ p["W_o"], (k, v, held)

    return attend


held_out("qkv_biases_dropped", _attention(None, None, None), replaces="llama_attention",
         bug="q, k and v biases dropped (Qwen2's b_q, b_k, b_v never read)", cause="bias")
held_out("key_bias_on_values", _attention("b_q", "b_k", "b_k"), replaces="llama_attention",
         bug="the key bias added to the values (b_k where b_v belongs)", cause="bias")
held_out("prefill_window_one_wider", _attention("b_q", "b_k", "b_v", prefill_window=lambda window: window + 1), replaces="llama_attention",
         bug="the prefill's window one key wider than the decode's (w + 1 keys)", cause="window")


def _refuses_long_prefill(ids, params, n_heads, n_kv_heads, rope_base=ref.ROPE_BASE, window=None, chunks=None, *, pairing="half_split",
                          eps=ref.EPS):
    first = np.shape(ids)[1] if chunks is None else int(np.asarray(chunks).reshape(-1)[0])
    if window is not None and first > window:
        raise ValueError(f"prefill of {first} tokens is longer than the window {window}")  # a limit, not a wrong answer
    return ref.llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, chunks, pairing=pairing, eps=eps)


held_out("refuses_long_prefill", _refuses_long_prefill, replaces="llama_decode",
         bug="llama_decode refuses a prefill longer than the window (a limit it does not declare)", cause="refusal")


def _float32_rope(x, positions, base=ref.ROPE_BASE, *, pairing="half_split"):
    angles = ref.rope_angles(positions, x.shape[-1], base).astype(np.float32)  # float32 tables, by design
    cos, sin = np.cos(angles), np.sin(angles)
    first, second = ref.rope_pairs(x.astype(np.float32), pairing)
    return ref.rope_join(first * cos - second * sin, first * sin + second * cos, pairing).astype(x.dtype)


held_out("rope_in_float32", _float32_rope, replaces="rope", bug="RoPE computed with float32 tables (correct code, float64 run)", cause="float32")


def outcomes_of(bug, *, profile="ci"):
    """(invariant, status, reason, measured) for every invariant on `bug` (a held one's reason and figures left empty); those that cannot
    reach its bug held unrun."""
    from invariants.mutants.matrix import _settings, could_reach
    from invariants.registry import all_invariants
    from invariants.runner import run_invariant

    impl, settings, triples = bug.implementation(), _settings(profile), []
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for inv in all_invariants():
            if inv.skip_reason(impl):
                continue
            if not could_reach(inv, impl.namespace, bug.replaces):
                triples.append((inv.name, "passed", "", {}))
                continue
            outcome = run_invariant(inv, impl, settings=settings)
            if not outcome.check_crashed:
                triples.append((inv.name, outcome.status, *(("", {}) if outcome.passed else (outcome.reason, outcome.measured))))
    return triples


OUTCOMES = Path(__file__).parent / "fixtures" / "heldout_outcomes.json"  # written by main(): a ci run of the whole suite on each bug


def figures(outcomes=None, outcomes_2=None):
    """The likely-bug line measured on bugs it was not written for (issue 35 §2), from the stored outcomes:

    "held_out", "held_out_2": (bugs whose first cause named is theirs, bugs, mean kinds of bug the line lists), graded in KINDS;
    "documented": (bugs whose line names an invariant of their named_by, bugs, mean kinds listed); "documented_component": (bugs
    whose line names an invariant of their killed_by's component, bugs).
    """
    from heldout_bugs_2 import HELD_OUT_2, OUTCOMES_2

    from invariants.diagnosis import likely_bug
    from invariants.mutants.documented import documented_mutants

    outcomes = json.loads(OUTCOMES.read_text()) if outcomes is None else outcomes
    outcomes_2 = json.loads(OUTCOMES_2.read_text()) if outcomes_2 is None and OUTCOMES_2.exists() else outcomes_2 or {}
    said = {name: likely_bug(rows)[0] for name, rows in {**outcomes, **outcomes_2}.items()}
    documented = [m for m in documented_mutants() if m.name in said]
    first = {name: kinds_named(said[name].cause if said[name] else "") for name in said}
    return {
        "held_out": first_cause_figures({n: said[n] and said[n].cause for n in FIRST_SET_KINDS if n in said}, FIRST_SET_KINDS),
        "held_out_2": first_cause_figures({n: said[n] and said[n].cause for n in HELD_OUT_2 if n in said},
                                          {n: bug.cause for n, bug in HELD_OUT_2.items()}),
        "documented": (sum(bool(said[m.name]) and said[m.name].invariant in m.named_by for m in documented), len(documented),
                       sum(len(first[m.name]) for m in documented) / max(len(documented), 1)),
        "documented_component": (sum(bool(said[m.name]) and said[m.name].invariant.split(".")[0] == m.killed_by.split(".")[0]
                                     for m in documented), len(documented)),
    }


KINDS = {  # the vocabulary a likely-bug line is graded in: the kinds of bug it names, each found by its words (issue 35 §2)
    "eps": r"\beps\b|ε", "centring": r"centr|layer ?norm", "gain": r"\bgains?\b", "final_norm": r"final (rms)?norm",
    "bias": r"\bbias|\bb_[qkv]\b", "window": r"window", "float32": r"float32|rounding size", "refusal": r"refus",
    "mask": r"\bmask|causal|\btril|\btriu|diagonal|the future", "softmax_axis": r"query axis|over the queries|columns sum",
    "scale": r"1/√|√d|\bscaled?\b|sqrt", "rope_positions": r"rope|rotat|pairing|frequenc|θ|theta",
    "decode_positions": r"past_length|offset|positions? (from 0|restart)|wrong positions", "cache": r"\bcache",
    "heads": r"kv heads|heads? (are )?(repeated|tiled|interleav)|repeat_kv|reshape|transpose", "residual": r"residual|\bskip",
    "precision": r"float16|bfloat16|\bhalf\b|lower precision|overflow",
}
FIRST_SET_KINDS = {"heldout.rms_eps_outside_root": "eps", "heldout.rms_one_plus_gain": "gain", "heldout.rms_centred": "centring",
                   "heldout.rms_in_float32": "float32", "heldout.qkv_biases_dropped": "bias", "heldout.key_bias_on_values": "bias",
                   "heldout.prefill_window_one_wider": "window", "heldout.refuses_long_prefill": "refusal", "heldout.rope_in_float32": "float32"}


def kinds_named(saying):
    """The kinds of bug (KINDS) a likely-bug line's words name, in the order they first appear."""
    found = {kind: re.search(pattern, saying, re.IGNORECASE) for kind, pattern in KINDS.items()}
    return [kind for kind, hit in sorted(((k, h) for k, h in found.items() if h), key=lambda t: t[1].start())]


def first_cause_figures(sayings, kinds):
    """(first right, bugs, mean kinds listed) over {bug: its likely-bug saying or None}: first right when the first kind named is the bug's."""
    named = {name: kinds_named(saying or "") for name, saying in sayings.items()}
    right = sum(bool(named[name]) and named[name][0] == kinds[name] for name in named)
    return right, len(named), sum(len(n) for n in named.values()) / max(len(named), 1)


def main(names=(), *, second=False):
    """Write every held-out and documented bug's outcomes to OUTCOMES (with --second, the second set's to OUTCOMES_2), a bug a line
    (python -m tests.heldout_bugs [--second] [NAME ...]; minutes): those named are rerun, the others kept as they are."""
    from invariants.mutants.documented import documented_mutants

    if second:
        from heldout_bugs_2 import HELD_OUT_2
        from heldout_bugs_2 import OUTCOMES_2 as path

        every = HELD_OUT_2.values()
    else:
        every, path = (*HELD_OUT.values(), *documented_mutants()), OUTCOMES
    bugs = [bug for bug in every if not names or bug.name in names]
    rows = json.loads(path.read_text()) if names and path.exists() else {}
    for bug in bugs:  # written after each: a long run stopped keeps what it did
        rows[bug.name] = outcomes_of(bug)
        path.write_text("{\n" + ",\n".join(f"{json.dumps(name)}: {json.dumps(rows[name])}" for name in sorted(rows)) + "\n}\n")
        print(bug.name, flush=True)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent))  # heldout_bugs_2, as pytest finds it
    main([a for a in sys.argv[1:] if a != "--second"], second="--second" in sys.argv[1:])
