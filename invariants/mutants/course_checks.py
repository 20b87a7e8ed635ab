"""The P01 course's own example-based checks, rewritten as plain deterministic tests of an implementation.

The baseline the kill matrix measures the invariant suite against (seed 004, "P01 hands-on"):

    block 1  the character tokenizer round-trips a fixed text
    block 2  a batch's y is its x shifted by one
    block 3  uniform logits give the entropy floor ln V; logits of 1e4 give it too, without NaN
    block 4  one causal head (T 6, d 16): weight rows sum to 1, no weight above the diagonal is > 0
    block 5  the leak test (T 10, d 16): scramble positions 5..9, positions 0..4 stay bit-identical
    block 9  the torch attention agrees with the numpy one to < 1e-10 (torch implementations only)

Fixed inputs from a fixed seed, the course's shapes and its np.allclose tolerance: one example
each, written as the course writes them. The course's "one head" is the protocol's attention
with one head and W_o = I. Each check takes an invariants.protocol.Implementation, returns on
success and raises on failure (InvariantViolation for a wrong answer; whatever the
implementation raised otherwise); CourseCheckSkipped when it does not apply. Blocks 6 to 8
assert nothing (block 8 prints a parameter count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import invariants.reference.numpy as numpy_reference
from invariants.asserts import assert_close, assert_equal, assert_finite, assert_shape, assert_value
from invariants.tolerance import FLOAT64_AGREEMENT, Tolerance

ALLCLOSE = Tolerance(rtol=1e-5, atol=1e-8, dtype="float64")  # np.allclose's defaults, which the course uses
VOCAB = 28  # the course's character vocabulary: ' .abcdefghijklmnopqrstuvwxyz'
TEXT = "the quick brown fox jumps over the lazy dog. the dog naps."  # every one of those 28 characters
SEED = 0

CHECKS: dict = {}


class CourseCheckSkipped(Exception):
    """The check does not apply to this implementation; the message says why."""


@dataclass(frozen=True)
class CourseCheck:
    """One of the course's example-based checks: a fixed input, a fixed expectation."""

    name: str  # "block4.rows_sum_to_one"
    statement: str
    requires: tuple
    backends: tuple
    check: Callable = field(repr=False)

    def __call__(self, impl):
        reason = self.skip_reason(impl)
        if reason:
            raise CourseCheckSkipped(reason)
        self.check(impl)

    def skip_reason(self, impl):
        if impl.backend not in self.backends:
            return f"{self.name} compares a {' or '.join(self.backends)} implementation (this one is {impl.backend})"
        return impl.missing(self.requires)


def course_check(*, block, requires, backends=("numpy", "torch")):
    """Register the decorated check(impl) as the course check '<block>.<function name>'."""

    def register(check):
        name = f"block{block}.{check.__name__}"
        CHECKS[name] = CourseCheck(name, " ".join(check.__doc__.split()), tuple(requires), tuple(backends), check)
        return CHECKS[name]

    return register


def all_course_checks():
    """Every course check, in the course's block order."""
    return list(CHECKS.values())


def _head(impl, x, W_q, W_k, W_v):
    """The course's one causal head: the protocol's attention with one head and no output projection."""
    d = x.shape[-1]
    return impl.attention(x, W_q, W_k, W_v, np.eye(d), 1, True)


def _head_weights(rng, d, n=3):
    return [rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(n)]


@course_check(block=1, requires=("build_vocab", "encode", "decode"))
def tokenizer_round_trip(impl):
    """decode(encode(text)) gives the text back, with the vocabulary built from it."""
    vocab = impl.build_vocab(TEXT)
    assert_value(impl.decode(impl.encode(TEXT, vocab), vocab), TEXT, "decode(encode(text))")


@course_check(block=2, requires=("get_batch",))
def targets_are_inputs_shifted_by_one(impl):
    """A batch of 4 windows of 8 from the encoded text: x[:, 1:] == y[:, :-1]."""
    data = numpy_reference.encode(TEXT, numpy_reference.build_vocab(TEXT))  # (n,)
    x, y = impl.get_batch(data, 4, 8, SEED)
    x, y = assert_shape(x, (4, 8), "x"), assert_shape(y, (4, 8), "y")
    assert_equal(y[:, :-1], x[:, 1:], "y[:, :-1] (should be x[:, 1:])")


@course_check(block=3, requires=("cross_entropy",))
def uniform_loss_is_the_entropy_floor(impl):
    """Uniform logits over the course's 28 characters give a loss of ln 28 = 3.3322 nats."""
    rng = np.random.default_rng(SEED)
    loss = impl.cross_entropy(np.zeros((2, 5, VOCAB)), rng.integers(0, VOCAB, (2, 5)))
    assert_close(loss, np.log(VOCAB), "cross_entropy(zeros (2, 5, 28), targets)", ALLCLOSE)


@course_check(block=3, requires=("cross_entropy",))
def huge_logits_give_the_floor_without_nan(impl):
    """Logits all equal to 1e4 give ln 28 too, and no NaN."""
    loss = impl.cross_entropy(np.full((1, 1, VOCAB), 1e4), np.zeros((1, 1), dtype=np.int64))
    assert_finite(loss, "cross_entropy(1e4 everywhere)")
    assert_close(loss, np.log(VOCAB), "cross_entropy(1e4 everywhere)", ALLCLOSE)


@course_check(block=4, requires=("attention",))
def rows_sum_to_one(impl):
    """One causal head on a fixed (1, 6, 16) input: every row of attention weights sums to 1."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((1, 6, 16))  # (B, T, d)
    _, weights = _head(impl, x, *_head_weights(rng, 16))
    weights = assert_shape(weights, (1, 1, 6, 6), "attention weights")  # (B, H, T, T)
    assert_close(weights.sum(axis=-1), 1.0, "row sums of the attention weights", ALLCLOSE)


@course_check(block=4, requires=("attention",))
def upper_triangle_is_zero(impl):
    """One causal head on the same input: the largest weight above the diagonal is exactly 0 (as the course writes it)."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((1, 6, 16))
    _, weights = _head(impl, x, *_head_weights(rng, 16))
    weights = assert_shape(weights, (1, 1, 6, 6), "attention weights")
    # np.triu(A, 1).max() == 0: the course's own test, which negative weights above the diagonal would pass
    assert_value(np.triu(weights[0, 0], k=1).max(), 0.0, "the largest attention weight above the diagonal")


@course_check(block=5, requires=("attention",))
def leak_test(impl):
    """Scrambling positions 5..9 of a fixed (1, 10, 16) input leaves the head's outputs at 0..4 bit-identical."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((1, 10, 16))
    W = _head_weights(rng, 16)
    scrambled = x.copy()
    scrambled[:, 5:] = rng.standard_normal((1, 5, 16))
    before, _ = _head(impl, x, *W)
    after, _ = _head(impl, scrambled, *W)
    assert_equal(assert_shape(after, x.shape, "head output")[:, :5], before[:, :5], "head outputs at positions 0..4")


@course_check(block=9, requires=("attention",), backends=("torch",))
def torch_agrees_with_numpy(impl):
    """Four-head causal attention in torch agrees with the numpy version to < 1e-10 on a fixed (1, 6, 32) input."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((1, 6, 32))
    W = _head_weights(rng, 32, n=4)
    expected, _ = numpy_reference.attention(x, *W, 4, True)
    got, _ = impl.attention(x, *W, 4, True)
    tol = Tolerance(rtol=0.0, atol=FLOAT64_AGREEMENT, dtype="float64")  # the course's max |diff| < 1e-10
    assert_close(assert_shape(got, x.shape, "attention output"), expected, "torch attention vs numpy attention", tol)
