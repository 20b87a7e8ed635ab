"""Broken softmax and cross-entropy: the axis, overflow, masking and averaging bugs the course warns about."""

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import softmax


@mutant(replaces="softmax", killed_by="softmax.softmax_rows_sum_to_one", bug="normalised over axis 0 whatever `axis` says")
def softmax_over_axis_zero(x, axis=-1):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


@mutant(replaces="softmax", killed_by="softmax.softmax_large_logits", bug="no max subtraction: exp(1e4) overflows, inf/inf is NaN")
def softmax_without_max_subtraction(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


@mutant(replaces="softmax", killed_by="softmax.softmax_masked_entries_are_zero", bug="clipped to [1e-12, 1] for a safe log: masked entries get 1e-12")
def softmax_clipped_for_log(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return np.clip(e / e.sum(axis=axis, keepdims=True), 1e-12, 1.0)


@mutant(also_named_by=("softmax.softmax_rows_sum_to_one",),
        replaces="softmax", killed_by="softmax.softmax_entries_in_unit_interval", bug="returns log-probabilities (log_softmax)")
def softmax_returns_log_probabilities(x, axis=-1):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


@mutant(also_named_by=("softmax.cross_entropy_known_values", "softmax.cross_entropy_non_negative"),
        replaces="cross_entropy", killed_by="softmax.cross_entropy_large_logits", bug="log-sum-exp without the max: exp(1e4) overflows to inf")
def cross_entropy_without_max_subtraction(logits, targets):
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))  # (..., V)
    return -np.take_along_axis(log_probs, targets[..., None], axis=-1).mean()


@mutant(replaces="log_softmax", killed_by="softmax.cross_entropy_large_logits", bug="log(softmax(x)): an underflowed 0 gives log 0 = -inf")
def log_of_softmax(x, axis=-1):
    return np.log(softmax(x, axis))


@mutant(replaces="cross_entropy", killed_by="softmax.cross_entropy_uniform_is_log_vocab", bug="summed over tokens instead of averaged")
def cross_entropy_summed(logits, targets):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, targets[..., None], axis=-1).sum()


@mutant(replaces="cross_entropy", killed_by="softmax.cross_entropy_uniform_is_log_vocab", bug="in bits (log2) instead of nats")
def cross_entropy_in_bits(logits, targets):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log2_probs = (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))) / np.log(2.0)
    return -np.take_along_axis(log2_probs, targets[..., None], axis=-1).mean()


@mutant(also_named_by=("softmax.cross_entropy_shift_invariance",),
        replaces="cross_entropy", killed_by="softmax.cross_entropy_non_negative", bug="the target's raw logit is negated, without log-softmax")
def cross_entropy_of_raw_logits(logits, targets):
    return -np.take_along_axis(logits, targets[..., None], axis=-1).mean()


@mutant(also_named_by=("softmax.cross_entropy_non_negative",),
        replaces="cross_entropy", killed_by="softmax.cross_entropy_shift_invariance", bug="log-sum-exp subtracts the max but never adds it back")
def cross_entropy_max_not_added_back(logits, targets):
    lse = np.log(np.exp(logits - logits.max(axis=-1, keepdims=True)).sum(axis=-1))  # (...,), missing + max
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # (...,)
    return (lse - picked).mean()


@mutant(
    replaces="softmax",
    killed_by="softmax.softmax_masked_entries_are_zero",
    bug="-inf replaced by -1e4 \"to avoid NaN\" (GPT-2's masked_bias): a masked entry gets a probability once the row is near -1e4",
)
def softmax_masked_to_minus_1e4(x, axis=-1):
    x = np.where(np.isneginf(x), -1e4, x)  # BUG: -1e4 is not -inf
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@mutant(
    replaces="softmax",
    killed_by="softmax.softmax_agrees_with_reference",
    bug="computed in float16 inside (x.astype(np.float16)) and cast back: a float32 run keeps about 3 digits",
    dtype="float32",
)
def softmax_in_float16(x, axis=-1):
    h = x.astype(np.float16)  # BUG: float16 internals
    e = np.exp(h - h.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)
