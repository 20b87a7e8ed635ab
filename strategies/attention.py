"""Inputs for multi-head self-attention: x and the four projections, valid by construction."""

from __future__ import annotations

from hypothesis import strategies as st

from strategies._validation import InvalidArgument, check_float, check_order
from strategies.core import attention_shapes, float_arrays, weights

PROJECTIONS = ("W_q", "W_k", "W_v", "W_o")


def attention_inputs(
    *,
    min_batch=1,
    max_batch=3,
    min_seq=1,
    max_seq=8,
    min_heads=1,
    max_heads=4,
    min_d_head=1,
    max_d_head=8,
    causal=None,
    min_scale=1.0,
    max_scale=1.0,
    gain=1.0,
):
    """dicts {x (B, T, d), W_q, W_k, W_v, W_o (d, d), n_heads, causal}, in the order attention takes them.

    The shape comes from attention_shapes (the min_/max_ pairs are passed to it), so
    d_model = n_heads·d_head and the edge cases seq 1, one head and d_head 1 (n_heads = d_model)
    are drawn on purpose. x is standard normal times a scale in [min_scale, max_scale]; the
    projections have std gain/√d, so with the defaults the scores q·k/√d_head are of unit size
    and the softmax is neither saturated nor flat. causal=None draws it; True or False fixes it.
    """
    shapes = attention_shapes(
        min_batch=min_batch, max_batch=max_batch, min_seq=min_seq, max_seq=max_seq,
        min_heads=min_heads, max_heads=max_heads, min_d_head=min_d_head, max_d_head=max_d_head,
    )  # validates the min_/max_ pairs
    if causal is not None and not isinstance(causal, bool):
        raise InvalidArgument(f"causal={causal!r} must be True, False, or None to draw it")
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)
    check_float("gain", gain, positive=True)
    causals = st.booleans() if causal is None else st.just(causal)

    @st.composite
    def inputs(draw):
        shape = draw(shapes)
        d = shape.d_model
        drawn = {"x": draw(float_arrays((shape.batch, shape.seq, d), min_scale=min_scale, max_scale=max_scale))}  # (B, T, d)
        for name in PROJECTIONS:
            drawn[name] = draw(weights((d, d), gain=gain))  # (d, d)
        drawn["n_heads"] = shape.n_heads
        drawn["causal"] = draw(causals)
        return drawn

    return inputs()


def attention_args(inputs):
    """The positional arguments of attention(x, W_q, W_k, W_v, W_o, n_heads, causal) from an attention_inputs dict."""
    return tuple(inputs[name] for name in ("x", *PROJECTIONS, "n_heads", "causal"))
