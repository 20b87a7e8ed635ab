"""Invariants of feed_forward: position-wise (each token alone), token-permutation equivariance, W2 = 0 gives b2, reference.

The hidden width F is drawn in [1, 4·d], or is exactly ratio·d where the implementation declares
FEED_FORWARD_RATIO (a network built for one width); the GELU form is either, or the declared one.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from invariants.asserts import assert_close, assert_equal, assert_shape
from invariants.conventions import biases_as_declared, d_ff_for, rounding_dtype
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import assert_close_to_a_gelu_form, reference_answer, reference_answers
from invariants.registry import invariant
from invariants.strategies.core import integers, permutations
from invariants.strategies.feed_forward import feed_forward_weights, hidden_states
from invariants.tolerance import agreement_tolerance

LESSON = 50  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("feed_forward",)  # the protocol functions whose laws it holds

ARGS = ("W1", "b1", "W2", "b2")


def _draw(impl, case, **states):
    """Token states x (B, T, d) and weights with a hidden width F in [1, 4·d] (exactly ratio·d with FEED_FORWARD_RATIO declared)."""
    x = case.draw(hidden_states(**states), "x")  # (B, T, d)
    d = x.shape[-1]
    fixed = d_ff_for(impl, d)
    widths = dict(min_hidden=1, max_hidden=4 * d) if fixed is None else dict(min_hidden=fixed, max_hidden=fixed)
    p = case.draw(biases_as_declared(impl, feed_forward_weights(d, **widths)), "W1, b1, W2, b2")
    return x, p


@valid_inputs("feed_forward")
def feed_forward_arguments(impl, case):
    """A (B, T, d) batch and W1, b1, W2, b2, the hidden width and biases as declared."""
    x = case.draw(hidden_states(max_batch=2, max_seq=3, max_d=6), "x")  # (B, T, d)
    d_ff = d_ff_for(impl, x.shape[-1])  # None unless FEED_FORWARD_RATIO is declared
    widths = dict(min_hidden=1, max_hidden=8) if d_ff is None else dict(min_hidden=d_ff, max_hidden=d_ff)
    p = case.draw(biases_as_declared(impl, feed_forward_weights(x.shape[-1], **widths)), "W1, b1, W2, b2")
    return x, p["W1"], p["b1"], p["W2"], p["b2"]


def _term_scale(impl, x, p):
    """The largest sum of term sizes, max of (|x|·|W1| + |b1|)·|W2| + |b2|: a matrix product rounds relative to the terms
    it adds, not to its result (which may cancel to near 0), and GELU passes errors in h = x·W1 + b1 on with a slope below 1.13."""
    x, W1, b1, W2, b2 = (np.abs(a) for a in impl.as_seen((x, *(p[name] for name in ARGS))))
    return float(((x @ W1 + b1) @ W2 + b2).max())  # (B, T, d) -> scalar


def _ffn(impl, x, p, call):
    return assert_shape(impl.feed_forward(x, *(p[name] for name in ARGS)), x.shape, "feed_forward(x)", call)


@invariant(
    requires=("feed_forward",),
    hint="tokens are mixed: something is pooled over the sequence or batch axis (a mean, a norm, a sum) inside the feed-forward network",
)
def feed_forward_position_wise(impl, case):
    """Changing one token of x leaves the feed-forward output at every other token exactly unchanged (same shapes, so bitwise)."""
    x, p = _draw(impl, case)
    B, T, d = x.shape
    b, t = case.draw(integers(0, B - 1), "changed batch item"), case.draw(integers(0, T - 1), "changed token")
    new = case.draw(hidden_states(min_batch=1, max_batch=1, min_seq=1, max_seq=1, min_d=d, max_d=d), "new token")  # (1, 1, d)
    changed = x.copy()
    changed[b, t] = new[0, 0]
    call = f"feed_forward(x, W1, b1, W2, b2) with token [{b}, {t}] replaced"
    keep = np.ones((B, T), dtype=bool)
    keep[b, t] = False
    before, after = _ffn(impl, x, p, call), _ffn(impl, changed, p, call)
    assert_equal(after[keep], before[keep], f"feed_forward output at tokens other than [{b}, {t}]", call)


@invariant(
    requires=("feed_forward",),
    hint="the output depends on a token's position: a positional term or a shift along the sequence is added inside the network",
)
def feed_forward_permutation_equivariant(impl, case):
    """Permuting the tokens of x permutes the feed-forward output the same way: ffn(x[:, π]) = ffn(x)[:, π], to rounding.

    Not bitwise: a matrix multiply treats rows in blocks, and a row that moves to another
    block position may be summed in another order (torch float32 and numpy's BLAS, measured).
    """
    x, p = _draw(impl, case)
    perm = np.array(case.draw(permutations(range(x.shape[1])), "π (token order)"))
    call = "feed_forward(x[:, π], ...) vs feed_forward(x, ...)[:, π]"
    tol = impl.tolerance.at_scale(_term_scale(impl, x, p))
    assert_close(_ffn(impl, x[:, perm], p, call), _ffn(impl, x, p, call)[:, perm], "feed_forward(x[:, π])", tol, call)


@invariant(
    requires=("feed_forward",),
    hint="b2 is dropped, or the GELU (or another step) is applied after W2: with W2 = 0 the output must be b2 at every token; "
    "feed-forward layers built without biases (bias=False) declare FEED_FORWARD_BIASES = False",
)
def feed_forward_zero_W2_gives_b2(impl, case):
    """With W2 = 0 the output is b2 at every token, exactly (0·h sums to 0 and 0 + b2 = b2), so W2 = 0, b2 = 0 gives exactly 0."""
    x, p = _draw(impl, case)
    zero_bias = case.draw(st.booleans(), "b2 = 0 too")
    p = dict(p, W2=np.zeros_like(p["W2"]))
    if zero_bias:
        p["b2"] = np.zeros_like(p["b2"])
    call = f"feed_forward(x, W1, b1, zeros, {'zeros' if zero_bias else 'b2'})"
    expected = np.broadcast_to(impl.as_seen(p["b2"]), x.shape)  # (B, T, d)
    assert_equal(_ffn(impl, x, p, call), expected, "feed_forward(x) with W2 = 0", call)


@invariant(
    requires=("feed_forward",),
    hint="a convention differs from GELU(x·W1 + b1)·W2 + b2: a bias is dropped, a weight is transposed, or another activation is used "
         "(or the other GELU form than the one GELU_FORM declares)",
)
def feed_forward_agrees_with_reference(impl, case):
    """feed_forward agrees with the float64 reference, either GELU form: 1e-10 in float64, the dtype tolerance otherwise, at the terms' scale.

    The whole output is held to one form: the one GELU_FORM declares, else the closer one.
    """
    x, p = _draw(impl, case)
    args = (x, *(p[name] for name in ARGS))
    call = "feed_forward(x, W1, b1, W2, b2)"
    got = _ffn(impl, x, p, call)
    tol = agreement_tolerance(rounding_dtype(impl)).at_scale(_term_scale(impl, x, p))
    assert_close_to_a_gelu_form(impl, got, reference_answers(impl, "feed_forward", *args), "feed_forward(x, W1, b1, W2, b2)", tol, call,
                                other_answer=lambda form: reference_answer(impl, "feed_forward", *args, gelu_form=form))
