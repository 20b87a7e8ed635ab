"""The lesson's four figures, computed from the reference and the accounting, drawn with matplotlib.

    python -m invariants.htmlreport figures                 # examples/figures/*.png
    python -m invariants.htmlreport figures -o DIR

Each figure has a data function (numpy and the project only: what the tests check exactly) and
a drawing (matplotlib, imported inside `draw` alone, so the package imports without it):

    masks            the encoder's and the decoder's attention weights on the same input: only the last row is equal
    param_breakdown  where the parameters live: the four GPT-2 sizes, Llama 3 8B and Mixtral 8x7B (total and active)
    gelu_vs_relu     the reference's GELU (tanh form) against ReLU
    moe_load         tokens per expert for the lesson's untrained router, then after a few steps on the balancing loss

Everything is seeded: the same data, and with the pinned matplotlib the same PNG bytes, on every run.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAMES = ("masks", "param_breakdown", "gelu_vs_relu", "moe_load")
DPI = 100  # a 6.4 x 3.6 inch figure is 640 x 360 pixels
PALETTE = 128  # colours per PNG
BLUE, RED, MUTED, INK = "#2563eb", "#dc2626", "#9ca3af", "#111827"
PART_COLOURS = {  # invariants.accounting.PARTS that a shown model has, in the order a token meets them
    "embeddings": MUTED, "attention": BLUE, "feed_forward": RED, "shared_experts": "#f59e0b",
    "experts": "#f97316", "router": "#7c3aed", "norms": INK, "head": "#a16207",
}


# -- data ------------------------------------------------------------------------------------------


def mask_patterns(n_tokens=6, d_model=16, seed=3):
    """{"encoder (bidirectional)": (T, T), "decoder (causal)": (T, T)}: one head's weights on the same normed input and weights."""
    from invariants.reference.numpy import attention, layer_norm

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, n_tokens, d_model))  # (B, T, d)
    W_q, W_k, W_v, W_o = (rng.normal(0, 1 / math.sqrt(d_model), (d_model, d_model)) for _ in range(4))
    normed = layer_norm(x, np.ones(d_model), np.zeros(d_model))
    out = {}
    for name, causal in (("encoder (bidirectional)", False), ("decoder (causal)", True)):
        _, weights = attention(normed, W_q, W_k, W_v, W_o, 1, causal)  # weights (B, H, T, T)
        out[name] = weights[0, 0]
    return out


PARAM_MODELS = (  # (label, accounting's shipped config, which count)
    ("small", "gpt2", "total"), ("medium", "gpt2-medium", "total"), ("large", "gpt2-large", "total"), ("XL", "gpt2-xl", "total"),
    ("Llama 3 8B", "llama-3-8b", "total"), ("Mixtral 8x7B", "mixtral-8x7b", "total"), ("Mixtral 8x7B\nper token (k = 2)", "mixtral-8x7b", "active"),
)


def param_parts():
    """[(label, {part: parameters}, total)] for PARAM_MODELS, from invariants.accounting.param_count (exact, as transformers counts them)."""
    from invariants.accounting import param_count

    rows = []
    for label, name, which in PARAM_MODELS:
        count = param_count(name)
        parts = dict(count.parts if which == "total" else count.active_parts)
        rows.append((label, parts, sum(parts.values())))
    return rows


def gelu_curves(lo=-4.0, hi=4.0, n=401):
    """(x, relu(x), gelu(x)) with the reference's GELU (the tanh form GPT-2 uses)."""
    from invariants.reference.numpy import gelu

    x = np.linspace(lo, hi, n)
    return x, np.maximum(x, 0.0), gelu(x)


@dataclass(frozen=True)
class RouterLoads:
    before: np.ndarray  # (E,) tokens per expert, untrained router
    after: np.ndarray  # (E,) after `steps` steps of gradient descent on the balancing loss
    loss_before: float
    loss_after: float
    steps: int
    learning_rate: float
    n_tokens: int
    k: int


def balancing_loss_gradient(x, router, k):
    """d load_balancing_loss(x·W_r, k) / dW_r, with the hard counts f held constant (they have no gradient; Switch, eq. 4-6).

    L = E·Σ_i f_i·P_i with P_i = mean_n s_ni and s = softmax(x·W_r), so dL/dz_nj = (E/N)·s_nj·(f_j − Σ_i f_i·s_ni).
    tests/test_htmlreport.py checks it against autograd through reference.torch.load_balancing_loss.
    """
    from invariants.reference.numpy import softmax, tokens_per_expert

    z = x @ router  # (N, d) x (d, E) -> (N, E)
    N, E = z.shape
    s = softmax(z)  # (N, E)
    f = tokens_per_expert(z, k) / (N * k)  # (E,), sums to 1
    dz = (E / N) * s * (f - (s * f).sum(axis=-1, keepdims=True))  # (N, E)
    return x.T @ dz  # (d, N) x (N, E) -> (d, E)


def router_loads(*, d_model=16, n_experts=8, n_tokens=256, k=2, steps=25, learning_rate=1.0):
    """The lesson's untrained router (seed 0, std 1/√d) on 256 tokens (seed 1), then `steps` plain gradient steps on the balancing loss alone."""
    from invariants.reference.numpy import load_balancing_loss, tokens_per_expert

    router = np.random.default_rng(0).normal(0, 1 / math.sqrt(d_model), (d_model, n_experts))  # (d, E)
    x = np.random.default_rng(1).standard_normal((n_tokens, d_model))  # (N, d)
    before = tokens_per_expert(x @ router, k)
    loss_before = float(load_balancing_loss(x @ router, k))
    trained = router.copy()
    for _ in range(steps):
        trained -= learning_rate * balancing_loss_gradient(x, trained, k)
    return RouterLoads(before, tokens_per_expert(x @ trained, k), loss_before, float(load_balancing_loss(x @ trained, k)),
                       steps, learning_rate, n_tokens, k)


# -- drawing ---------------------------------------------------------------------------------------


def _masks(plt):
    weights = mask_patterns()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.9))
    T = next(iter(weights.values())).shape[0]
    for ax, (name, w) in zip(axes, weights.items(), strict=True):
        im = ax.imshow(w, cmap="Blues", vmin=0, vmax=1)
        for i in range(T):
            for j in range(T):
                ax.text(j, i, f"{w[i, j]:.2f}".lstrip("0") if w[i, j] else "0", ha="center", va="center", fontsize=7,
                        color="white" if w[i, j] > 0.55 else INK)
        ax.add_patch(plt.Rectangle((-0.5, T - 1.5), T, 1, fill=False, edgecolor=RED, lw=2))
        ax.set_title(name)
        ax.set_xlabel("key (token looked at)")
        ax.set_ylabel("query (token looking)")
        ax.set_xticks(range(T))
        ax.set_yticks(range(T))
    fig.colorbar(im, ax=axes, fraction=0.03, label="attention weight")
    fig.suptitle("Same input, same weights: only the last row (red) is equal", fontsize=10)
    return fig


def _param_breakdown(plt):
    rows = param_parts()
    shown = [p for p in PART_COLOURS if any(parts[p] for _, parts, _ in rows)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4), gridspec_kw={"width_ratios": [4, 3]})
    for ax, chunk, scale, unit in ((left, rows[:4], 1e6, "M"), (right, rows[4:], 1e9, "B")):
        labels = [label for label, _, _ in chunk]
        bottom = np.zeros(len(chunk))
        for part in shown:
            values = np.array([parts[part] for _, parts, _ in chunk]) / scale
            ax.bar(labels, values, bottom=bottom, color=PART_COLOURS[part], label=part.replace("_", "-"), width=0.65)
            bottom += values
        for i, (_, parts, total) in enumerate(chunk):
            if unit == "M":  # GPT-2: the embedding table's share falls as blocks multiply
                share = f"emb. {100 * parts['embeddings'] / total:.0f}%"
            else:  # the configs: the feed-forward networks (dense or experts) dominate
                share = f"FF {100 * sum(parts[p] for p in ('feed_forward', 'shared_experts', 'experts')) / total:.0f}%"
            ax.text(i, bottom[i] * 1.02, f"{total / scale:,.{1 if unit == 'B' else 0}f}{unit}\n({share})", ha="center",
                    va="bottom", fontsize=8)
        ax.set_ylim(0, bottom.max() * 1.22)
        ax.set_ylabel(f"parameters ({'millions' if unit == 'M' else 'billions'})")
        ax.tick_params(axis="x", labelsize=8)
    left.set_title("GPT-2, four sizes", fontsize=10)
    right.set_title("Llama and Mixtral configs", fontsize=10)
    handles, names = left.get_legend_handles_labels()
    more_h, more_n = right.get_legend_handles_labels()
    for h, n in zip(more_h, more_n, strict=True):
        if n not in names:
            handles.append(h)
            names.append(n)
    fig.legend(handles, names, loc="lower center", ncol=len(names), frameon=False, fontsize=8)
    fig.suptitle("Where the parameters live (invariants.accounting.param_count, exact)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _gelu_vs_relu(plt):
    x, relu, gelu = gelu_curves()
    i = int(np.argmin(gelu))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(x, relu, color=MUTED, lw=2, label="ReLU: max(0, x)")
    ax.plot(x, gelu, color=BLUE, lw=2, label="GELU (tanh form, reference.numpy.gelu)")
    ax.plot([x[i]], [gelu[i]], "o", color=RED, ms=4)
    ax.annotate(f"minimum {gelu[i]:.3f} at x = {x[i]:.2f}", (x[i], gelu[i]), xytext=(-3.9, 1.0), fontsize=8,
                arrowprops={"arrowstyle": "->", "color": RED})
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xlabel("input to the activation")
    ax.set_ylabel("output")
    ax.set_title("GELU: a smooth ReLU", fontsize=11)
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def _moe_load(plt):
    loads = router_loads()
    E = len(loads.before)
    even = loads.n_tokens * loads.k / E
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    at = np.arange(E)
    ax.bar(at - 0.2, loads.before, width=0.4, color=MUTED, label=f"untrained router (balance loss {loads.loss_before:.4f})")
    ax.bar(at + 0.2, loads.after, width=0.4, color=BLUE,
           label=f"after {loads.steps} steps on the balance loss ({loads.loss_after:.4f})")
    ax.axhline(even, color=RED, ls="--", lw=1, label=f"perfectly even ({even:.0f} each)")
    for i, (b, a) in enumerate(zip(loads.before, loads.after, strict=True)):
        ax.text(i - 0.2, b + 0.5, str(b), ha="center", va="bottom", fontsize=7)
        ax.text(i + 0.2, a + 0.5, str(a), ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, max(loads.before.max(), loads.after.max()) * 1.35)
    ax.set_xticks(at)
    ax.set_xlabel("expert")
    ax.set_ylabel(f"tokens routed to it (of {loads.n_tokens}, top-{loads.k})")
    ax.set_title("An untrained router plays favourites; the balancing loss evens it out", fontsize=10)
    ax.legend(frameon=False, fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


_DRAW = {"masks": _masks, "param_breakdown": _param_breakdown, "gelu_vs_relu": _gelu_vs_relu, "moe_load": _moe_load}


def draw(names=NAMES):
    """{name: PNG bytes} for the named figures. Needs matplotlib (pip install 'transformer-invariants[report]')."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pngs = {}
    with plt.rc_context({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "ti"}):
        for name in names:
            fig = _DRAW[name](plt)
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})  # no version stamp: the bytes change only with the picture
            plt.close(fig)
            pngs[name] = _palette(buffer.getvalue())
    return pngs


def _palette(png, colours=None):
    """The PNG with at most `colours` (PALETTE) colours, undithered (a quarter of the bytes; flat pictures lose nothing visible)."""
    from PIL import Image  # matplotlib's own dependency

    out = io.BytesIO()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image.quantize(colors=colours or PALETTE, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, format="png", optimize=True)
    return out.getvalue()


def write(out_dir, names=NAMES):
    """Write out_dir/<name>.png for each figure; the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, png in draw(names).items():
        path = out / f"{name}.png"
        path.write_bytes(png)
        paths.append(path)
    return paths
