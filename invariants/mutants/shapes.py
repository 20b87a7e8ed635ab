"""Shape slips: answers whose values may be right but whose shape is not what the arguments call for."""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.mutants import mutant


@mutant(replaces="cross_entropy", killed_by="shapes.cross_entropy_answer_shape",
        bug="the per-token losses (N,) returned, not their mean (F.cross_entropy(..., reduction='none'))")
def per_token_cross_entropy(logits, targets):
    log_probs = ref.log_softmax(logits)  # (..., V)
    return -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (...): the bug, no mean


@mutant(replaces="gqa_attention", killed_by="shapes.gqa_attention_answer_shape",
        bug="out returned in flash-attention's (B, T, H, D) layout instead of (B, H, T, D)")
def flash_layout_gqa_attention(q, k, v, causal=True, key_mask=None, window=None):
    out, weights = ref.gqa_attention(q, k, v, causal, key_mask, window)  # out (B, H, T, D)
    return out.transpose(0, 2, 1, 3), weights  # the bug: (B, T, H, D), as flash_attn_func takes and returns it
