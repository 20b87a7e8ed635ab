"""Broken feed-forward networks: tokens mixed, a bias dropped, an activation too many.

Each takes the reference's gelu_form option (its block and moe pass one on) and uses that GELU.
"""

from invariants.mutants import mutant
from invariants.reference.numpy import gelu_of


@mutant(replaces="feed_forward", killed_by="feed_forward.feed_forward_position_wise", bug="the hidden layer's sequence mean is added to every token")
def feed_forward_mixing_tokens(x, W1, b1, W2, b2, *, gelu_form="tanh"):
    h = gelu_of(gelu_form)(x @ W1 + b1)  # (..., T, F)
    return (h + h.mean(axis=-2, keepdims=True)) @ W2 + b2


@mutant(replaces="feed_forward", killed_by="feed_forward.feed_forward_zero_W2_gives_b2", bug="b2 is never added")
def feed_forward_without_b2(x, W1, b1, W2, b2, *, gelu_form="tanh"):
    return gelu_of(gelu_form)(x @ W1 + b1) @ W2


@mutant(replaces="feed_forward", killed_by="feed_forward.feed_forward_zero_W2_gives_b2", bug="GELU applied to the output layer too")
def feed_forward_activated_output(x, W1, b1, W2, b2, *, gelu_form="tanh"):
    return gelu_of(gelu_form)(gelu_of(gelu_form)(x @ W1 + b1) @ W2 + b2)


@mutant(replaces="feed_forward", killed_by="feed_forward.feed_forward_agrees_with_reference", bug="b1 is never added")
def feed_forward_without_b1(x, W1, b1, W2, b2, *, gelu_form="tanh"):
    return gelu_of(gelu_form)(x @ W1) @ W2 + b2
