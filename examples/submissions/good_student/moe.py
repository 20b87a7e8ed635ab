"""Lesson extra: a top-k mixture of experts and the Switch balancing loss."""

import numpy as np
from layers import FeedForward, softmax


def top_k(scores, k):
    """Indices of the k best experts per token; on ties the lower index wins (stable sort)."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


class Router:
    def __init__(self, k):
        self.k = k

    def gates(self, scores):
        chosen = top_k(scores, self.k)
        g = np.zeros_like(scores)
        np.put_along_axis(g, chosen, softmax(np.take_along_axis(scores, chosen, axis=-1)), axis=-1)
        return g

    def counts(self, scores):
        return np.bincount(top_k(scores, self.k).ravel(), minlength=scores.shape[1])

    def balance_loss(self, scores):
        N, E = scores.shape
        f = self.counts(scores) / (N * self.k)
        P = softmax(scores).mean(axis=0)
        return E * (f * P).sum()


class MoE:
    def __init__(self, router_W, experts, k):
        self.router_W = router_W
        self.router = Router(k)
        self.experts = [FeedForward(e["W1"], e["b1"], e["W2"], e["b2"]) for e in experts]

    def __call__(self, x):
        g = self.router.gates(x @ self.router_W)
        out = np.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = g[:, e] > 0
            if rows.any():
                out[rows] += g[rows, e : e + 1] * expert(x[rows])
        return out


def ffn_params(d):
    return 8 * d * d + 5 * d


def moe_params(d, E, k=None):
    """Router (d x E, no bias) plus all experts, or only k of them when k is given (active parameters)."""
    return d * E + (E if k is None else k) * ffn_params(d)
