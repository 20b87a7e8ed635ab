"""A third held-out set: eps and precision bugs in a block's own norm (issue 37), written before the likely-bug line's rule that tells an
eps bug from float32 rounding, and frozen once written: its figures are measured, never tuned on.

Each is the numpy reference with one block replaced, its norms computed by the block itself, as a user's own decoder would do it:
the protocol's rms_norm and layer_norm stay correct, so only the block, model and decode laws see the bug. Each bug's `cause` is a
kind of tests/heldout_bugs.KINDS; the last is no bug but a control, correct code computing its norm in float32 by design.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from heldout_bugs import HeldOut, first_cause_figures, llama_block_with_norm, outcomes_of

import invariants.reference.numpy as ref

HELD_OUT_3: dict[str, HeldOut] = {}
OUTCOMES_3 = Path(__file__).parent / "fixtures" / "heldout_outcomes_3.json"  # python tests/heldout_bugs_3.py [NAME ...]


def held_out(slug, function, *, replaces, bug, cause):
    """Register `function` as the held-out bug heldout3.<slug>."""
    HELD_OUT_3[f"heldout3.{slug}"] = HeldOut(f"heldout3.{slug}", bug, "", "numpy", replaces, function, cause=cause)


def _gpt_block_with_norm(norm):
    """The reference's transformer_block with its two LayerNorms computed by `norm(x, gain, bias, eps)`."""

    def transformer_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=ref.EPS):
        p = params
        biases = {name: p[name] for name in ref.ATTENTION_BIAS_NAMES if name in p}
        attended, _ = ref.attention(norm(x, p["ln1_g"], p["ln1_b"], eps), p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal, **biases)
        x = x + attended
        return x + ref.feed_forward(norm(x, p["ln2_g"], p["ln2_b"], eps), p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)

    return transformer_block


def _rms_eps_squared(x, gain, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps**2) * gain  # BUG: eps² where eps belongs


def _rms_mean_square_in_float16(x, gain, eps):
    squares = (x * x).astype(np.float16)  # BUG: the mean square summed in float16 (a .half() before the reduction)
    mean_square = np.add.reduce(squares, axis=-1, keepdims=True, dtype=np.float16).astype(x.dtype) / x.shape[-1]
    return x / np.sqrt(mean_square + eps) * gain


def _layer_norm_eps_outside_root(x, gain, bias, eps):
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / (np.sqrt((centred * centred).mean(axis=-1, keepdims=True)) + eps) * gain + bias  # BUG: σ + eps


def _layer_norm_in_float32(x, gain, bias, eps):
    return ref.layer_norm(x.astype(np.float32), gain.astype(np.float32), bias.astype(np.float32), np.float32(eps)).astype(x.dtype)


held_out("rms_eps_squared", llama_block_with_norm(_rms_eps_squared), replaces="llama_block_step",
         bug="the block's RMSNorm adds eps² inside the root, not eps (x / √(ms + eps²))", cause="eps")
held_out("rms_mean_square_in_float16", llama_block_with_norm(_rms_mean_square_in_float16), replaces="llama_block_step",
         bug="the block's RMSNorm sums the squares in float16", cause="precision")
held_out("layer_norm_eps_outside_root", _gpt_block_with_norm(_layer_norm_eps_outside_root), replaces="transformer_block",
         bug="the GPT block's LayerNorm adds eps outside the root: (x - μ) / (σ + eps)", cause="eps")
held_out("layer_norm_in_float32", _gpt_block_with_norm(_layer_norm_in_float32), replaces="transformer_block",
         bug="the GPT block computes its LayerNorms in float32 (correct code, float64 run): a control", cause="float32")


def figures_3(outcomes=None):
    """(bugs whose first cause named is theirs, bugs, mean kinds of bug the line lists) over this set, from the stored outcomes."""
    from invariants.diagnosis import likely_bug

    outcomes = json.loads(OUTCOMES_3.read_text()) if outcomes is None else outcomes
    said = {name: likely_bug(rows)[0] for name, rows in outcomes.items()}
    return first_cause_figures({name: bug and bug.cause for name, bug in said.items()}, {n: bug.cause for n, bug in HELD_OUT_3.items()})


def main(names=()):
    """Write this set's outcomes to OUTCOMES_3, a bug a line; those named are rerun, the others kept as they are."""
    rows = json.loads(OUTCOMES_3.read_text()) if names and OUTCOMES_3.exists() else {}
    for bug in (bug for bug in HELD_OUT_3.values() if not names or bug.name in names):
        rows[bug.name] = outcomes_of(bug)
        OUTCOMES_3.write_text("{\n" + ",\n".join(f"{json.dumps(name)}: {json.dumps(rows[name])}" for name in sorted(rows)) + "\n}\n")
        print(bug.name, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
