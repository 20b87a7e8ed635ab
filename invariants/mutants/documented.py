"""A catalogue of documented bugs: code that public projects shipped, reported in their trackers.

Kept apart from the synthetic zoo (this module is not in ZOO_MODULES, and its mutants are not in
invariants.mutants.MUTANTS), so the kill matrix can say how many *real* bugs the suite catches:

    from invariants.mutants.documented import documented_mutants, equivalent_controls
    for m in documented_mutants():     # DocumentedMutant: .name .bug .killed_by .source .needs .implementation()
        ...
    for c in equivalent_controls():    # EquivalentControl: reported as bugs, shown equivalent; the suite must pass them
        ...

Each entry is the reference with one function replaced by the shipped code, translated to the
protocol's functional signature but keeping the original's arithmetic (the same operations in the
same order; an `nn.Linear(x)` becomes `x @ W`, a `.view` a `.reshape`). `original` quotes the
offending line(s) as they were shipped; `source` is the tracker thread ("owner/repo#number") that
documents it, `also` further threads. Where the original does something the protocol has no
place for (dropout, padding masks, a KV cache), that part is left out and the comment says so.

`killed_by` is the invariant whose hint names the bug (or, where no hint names it, the one that
catches it: docs/documented-bugs.md says which). `needs` is None when the ci profile kills the
mutant today; otherwise it names the region of input space the strategies would have to reach
(issue 10 §1): long sequences, large scores, float16. Those entries are the point of the
catalogue, not a weakness to paper over: the suite's draws stay in a tame corner.

Negative controls (EQUIVALENT) are "bugs" someone reported that the maintainers (or the thread)
showed to be equivalent: every applicable invariant must pass on them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import invariants.reference.numpy as ref
from invariants.mutants import Mutant

MODULE = "documented"
SOURCE_FORM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*#[1-9][0-9]*$")  # owner/repo#123

DOCUMENTED: dict[str, DocumentedMutant] = {}
EQUIVALENT: dict[str, EquivalentControl] = {}


def source_url(source):
    """https://github.com/owner/repo/issues/N for "owner/repo#N" (GitHub redirects a pull request's number there)."""
    repo, number = source.split("#")
    return f"https://github.com/{repo}/issues/{number}"


@dataclass(frozen=True)
class DocumentedMutant(Mutant):
    """A mutant whose bug a public project shipped: Mutant plus where it is documented and what it needs."""

    source: str = ""  # "owner/repo#N": the issue or pull request that documents the bug
    also: tuple = ()  # further threads, same form
    original: str = ""  # the offending line(s), as shipped
    project: str = ""  # what shipped it, e.g. "transformers 2.x GPT2 Attention._attn"
    needs: str | None = None  # None: killed at ci today; else the input region the strategies must reach

    @property
    def url(self):
        return source_url(self.source)


@dataclass(frozen=True)
class EquivalentControl(Mutant):
    """A reported "bug" shown to be equivalent: the suite must pass it (killed_by is None)."""

    source: str = ""
    also: tuple = ()
    original: str = ""
    project: str = ""
    why: str = ""  # why it is equivalent, as the thread showed
    needs: str | None = None

    @property
    def url(self):
        return source_url(self.source)


def _check_sources(name, source, also):
    for s in (source, *also):
        if not SOURCE_FORM.match(s):
            raise ValueError(f"{name}: source {s!r} is not of the form owner/repo#number")


def documented(*, replaces, killed_by, bug, source, original, project, also=(), needs=None, backend="numpy", dtype="float64"):
    """Register the decorated function as the shipped code of a documented bug (see the module docstring)."""

    def register(function: Callable):
        name = f"{MODULE}.{function.__name__}"
        if name in DOCUMENTED or name in EQUIVALENT:
            raise ValueError(f"documented mutant {name} is registered twice")
        _check_sources(name, source, also)
        DOCUMENTED[name] = DocumentedMutant(
            name, bug, killed_by, backend, replaces, function, dtype,
            source=source, also=tuple(also), original=original, project=project, needs=needs,
        )
        return function

    return register


def equivalent(*, replaces, bug, source, original, project, why, also=(), backend="numpy", dtype="float64"):
    """Register the decorated function as a negative control: reported as a bug, equivalent in fact."""

    def register(function: Callable):
        name = f"{MODULE}.{function.__name__}"
        if name in DOCUMENTED or name in EQUIVALENT:
            raise ValueError(f"control {name} is registered twice")
        _check_sources(name, source, also)
        EQUIVALENT[name] = EquivalentControl(
            name, bug, None, backend, replaces, function, dtype,
            source=source, also=tuple(also), original=original, project=project, why=why,
        )
        return function

    return register


def documented_mutants():
    """Every documented bug, in catalogue order."""
    return list(DOCUMENTED.values())


def equivalent_controls():
    """Every negative control (reported, shown equivalent), in catalogue order."""
    return list(EQUIVALENT.values())


# ---------------------------------------------------------------------------------------------
# Helpers shared by the attention translations: only the steps the originals got right.
# ---------------------------------------------------------------------------------------------


def _project(x, W, b):
    return x @ W if b is None else x @ W + b  # nn.Linear(x) with the protocol's (in, out) weight


def _future(T):
    return np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): True where key > query


def _split(y, n_heads):
    B, T, d = y.shape
    return y.reshape(B, T, n_heads, d // n_heads).transpose(0, 2, 1, 3)  # (B, H, T, D)


def _merge(heads):
    B, H, T, D = heads.shape
    return heads.transpose(0, 2, 1, 3).reshape(B, T, H * D)  # (B, T, d)


# ---------------------------------------------------------------------------------------------
# Softmax and the loss
# ---------------------------------------------------------------------------------------------


@documented(
    replaces="softmax",
    killed_by="softmax.softmax_large_logits",
    bug="softmax without the max subtraction: exp(x) / Σ exp(x) overflows to inf/inf = NaN at large logits",
    source="pyg-team/pytorch_geometric#53",
    project="PyTorch Geometric 1.0 torch_geometric/utils/softmax.py (GATConv's attention softmax)",
    original="out = src.exp()\nout = out / scatter_add(out, index, dim=0, dim_size=num_nodes)[index]",
)
def pyg_softmax_without_max(x, axis=-1):
    out = np.exp(x)  # out = src.exp(): no row max subtracted
    return out / out.sum(axis=axis, keepdims=True)  # scatter_add over the group = a sum along `axis`


@documented(
    replaces="log_softmax",
    killed_by="softmax.cross_entropy_large_logits",
    bug="log-softmax as x - (max + log Σ exp(x - max)): the log-sum-exp is rounded at the logits' magnitude, "
    "so the gaps between logits are lost (CE of [1e8, 1e8] is 0, not ln 2)",
    source="pytorch/pytorch#11752",
    also=("pytorch/pytorch#21672", "ml-explore/mlx#4188"),
    project="PyTorch 0.4.1 aten/src/ATen/native/SoftMax.cpp host_softmax (log_softmax under nn.CrossEntropyLoss)",
    original="if (LogSoftMax)\n  tmpsum = max_input + std::log(tmpsum);\n...\n"
    "    output_data[d * dim_stride] = input_data[d * dim_stride] - tmpsum;",
    needs="float32 logits of 1e6 and more, held to a tolerance at the loss's own size (equal logits [1e8, 1e8] give 0, "
    "not ln 2): the large-logit checks stop at 1e4 and allow rtol·max|x|, which absorbs this error at any magnitude",
    dtype="float32",
)
def pytorch_log_softmax_adds_max_first(x, axis=-1):
    max_input = x.max(axis=axis, keepdims=True)
    tmpsum = np.exp(x - max_input).sum(axis=axis, keepdims=True)
    tmpsum = max_input + np.log(tmpsum)  # BUG: the max goes back in before the subtraction
    return x - tmpsum


# ---------------------------------------------------------------------------------------------
# Norms and the activation
# ---------------------------------------------------------------------------------------------


@documented(
    replaces="layer_norm",
    killed_by="norms.layer_norm_known_values",
    bug="LayerNorm with torch's unbiased std (d - 1) and eps added to the std, outside the square root",
    source="harvardnlp/annotated-transformer#122",
    also=("harvardnlp/annotated-transformer#119", "codertimo/BERT-pytorch#30", "hyunwoongko/transformer#7"),
    project="The Annotated Transformer, class LayerNorm (copied into BERT-pytorch and others)",
    original="mean = x.mean(-1, keepdim=True)\nstd = x.std(-1, keepdim=True)\n"
    "return self.a_2 * (x - mean) / (std + self.eps) + self.b_2",
    backend="torch",
)
def annotated_transformer_layer_norm(x, gain, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)  # BUG: unbiased (Bessel's correction) by default
    return gain * (x - mean) / (std + eps) + bias  # BUG: eps outside the square root


@documented(
    replaces="layer_norm",
    killed_by="norms.layer_norm_scale_law",
    bug="LayerNorm with eps added to the (population) std instead of inside the square root",
    source="microsoft/CNTK#3816",
    project="CNTK layers.LayerNormalization (layer_normalize)",
    original="std = sqrt (reduce_mean (x0 * x0))  # EDGE CASE: you need the epsilon inside the sqrt!\n"
    "if (epsilon != 0):\n    std += epsilon\nx_hat = x0 / std",
)
def cntk_layer_norm_eps_on_std(x, gain, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)  # reduce_mean(x)
    x0 = x - mean
    std = np.sqrt((x0 * x0).mean(axis=-1, keepdims=True))
    if eps != 0:
        std = std + eps  # BUG: std += epsilon
    x_hat = x0 / std
    return x_hat * gain + bias


@documented(
    replaces="layer_norm",
    killed_by="norms.layer_norm_shift_invariance",
    bug="LayerNorm variance as E[x²] - E[x]² (one pass): catastrophic cancellation for rows whose mean is large next to "
    "their spread (mean 2000, std 1 in float32 gives variances of 0.2 and 48,000)",
    source="pytorch/pytorch#51102",
    also=("pytorch/pytorch#55044",),
    project="PyTorch 1.7.1 LayerNorm CPU kernel (aten/src/ATen/native/cpu/layer_norm_kernel.cpp)",
    original="mean_val = sum(X) / N;  rstd_val = std::max(sum(X * X) / N - mean_val * mean_val, 0);\n"
    "rstd_val = 1 / std::sqrt(rstd_val + eps);  Y = (X - mean_val) * rstd_val * gamma + beta",
    needs="float32 rows whose mean is ≳ 100× their std (the report: mean 2000, std 1): norm_rows keeps |mean| ≤ 5·std "
    "and the shift law adds constants of the rows' own size",
    backend="torch",
    dtype="float32",
)
def pytorch_cpu_layer_norm_naive_variance(x, gain, bias, eps=1e-5):
    import torch

    N = x.shape[-1]
    mean_val = x.sum(dim=-1, keepdim=True) / N
    rstd_val = torch.clamp((x * x).sum(dim=-1, keepdim=True) / N - mean_val * mean_val, min=0)  # BUG: E[x²] - E[x]²
    rstd_val = 1 / torch.sqrt(rstd_val + eps)
    return (x - mean_val) * rstd_val * gain + bias


@documented(
    replaces="rms_norm",
    killed_by="norms.rms_norm_scale_law",
    bug="RMSNorm's eps hard-coded to 1e-6 whatever the model asks for (LLaMA-2 needs 1e-5)",
    source="ggml-org/llama.cpp#2373",
    also=("ggml-org/llama.cpp#2374", "ggml-org/llama.cpp#2384", "apache/tvm#15856"),
    project="ggml ggml_compute_forward_rms_norm_f32 (llama.cpp, all backends, until July 2023)",
    original="const float eps = 1e-6f; // TODO: make this a parameter\n"
    "float mean = sum/ne00;\nconst float scale = 1.0f/sqrtf(mean + eps);",
)
def llama_cpp_rms_norm_fixed_eps(x, gain, eps=1e-5):
    eps = 1e-6  # BUG: const float eps = 1e-6f, the passed eps is ignored
    mean = (x * x).sum(axis=-1, keepdims=True) / x.shape[-1]  # sum of x² / ne00
    scale = 1.0 / np.sqrt(mean + eps)
    return x * scale * gain  # ggml_rms_norm, then ggml_mul by the norm weight


@documented(
    replaces="rms_norm",
    killed_by="norms.rms_norm_scale_law",
    bug="RMSNorm's sum of squares accumulated in float16: x² overflows to inf for |x| ≳ 256 (sum > 65504), "
    "and the row comes out 0",
    source="microsoft/onnxruntime#29034",
    also=("microsoft/onnxruntime#29045", "xlite-dev/LeetCUDA#335"),
    project="ONNX Runtime CUDA SkipSimplifiedLayerNormalization (simplified = RMS) in float16",
    original="(the fix's description; the kernel is CUDA) the simplified variance reduction accumulated its squared states "
    "in half; the fix makes them float: cub::BlockReduce<float, TPB>",
    backend="torch",
    dtype="float16",
)
def onnxruntime_half_sum_of_squares_rms_norm(x, gain, eps=1e-5):
    import torch

    d = x.shape[-1]
    sum_sq = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype, device=x.device)
    for i in range(d):  # BUG: the block reduction keeps its partial sums in half
        sum_sq = sum_sq + x[..., i : i + 1] * x[..., i : i + 1]
    return x / torch.sqrt(sum_sq / d + eps) * gain


@documented(
    replaces="gelu",
    killed_by="activation.gelu_close_to_erf_form",
    bug="tanh-GELU's constants swapped and √(2/π) written 7978845608 (no '0.'): tanh(0.044715·x·(1 + 7978845608·x²)) "
    "is a step, so gelu_fast is ReLU",
    source="huggingface/transformers#11514",
    project="transformers 4.5 activations_tf.gelu_fast (TF models with hidden_act='gelu_fast')",
    original="coeff1 = tf.cast(7978845608, x.dtype)\ncoeff2 = tf.cast(0.044715, x.dtype)\n"
    "return 0.5 * x * (1.0 + tf.tanh(x * coeff2 * (1.0 + coeff1 * x * x)))",
)
def tf_gelu_fast_coefficients(x):
    coeff1 = 7978845608.0  # BUG: should be 0.044715
    coeff2 = 0.044715  # BUG: should be 0.7978845608
    return 0.5 * x * (1.0 + np.tanh(x * coeff2 * (1.0 + coeff1 * x * x)))


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------


@documented(
    replaces="attention",
    killed_by="attention.causal_weights_pattern",
    bug="causal mask as a finite additive bias (masked scores become -1e4): once the visible scores sink to about -1e4 "
    "the future gets weight, and a trained model learns to read it",
    source="huggingface/transformers#15199",
    also=("huggingface/transformers#3181", "huggingface/transformers#9594", "huggingface/transformers#17121"),
    project="transformers 2.x-4.x GPT2 Attention._attn (masked_bias = -1e4)",
    original="b = self.bias[:, :, ns - nd : ns, :ns]\nw = w * b - 1e4 * (1 - b)",
)
def gpt2_finite_causal_mask(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    B, T, d = x.shape
    q, k, v = (_split(_project(x, W, b), n_heads) for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
    w = q @ k.transpose(0, 1, 3, 2)
    w = w / math.sqrt(v.shape[-1])  # if self.scale: w = w / math.sqrt(v.size(-1))
    if causal:  # GPT-2 is always causal; the protocol's causal=False skips the mask
        nd, ns = w.shape[-2], w.shape[-1]
        bias = np.tril(np.ones((ns, ns), dtype=x.dtype))  # the registered buffer (n_ctx × n_ctx), built here for T
        b = bias[ns - nd : ns, :ns]
        w = w * b - 1e4 * (1 - b)  # BUG: a finite mask value
    weights = ref.softmax(w)  # nn.Softmax(dim=-1)(w)
    return _project(_merge(weights @ v), W_o, b_o), weights


@documented(
    replaces="attention",
    killed_by="attention.agrees_with_reference",
    bug="each head's scores scaled by C**-0.5 with C = n_embd (d_model), not by the head size",
    source="karpathy/ng-video-lecture#6",
    also=("Graylab/DL4Proteins-notebooks#12",),
    project="karpathy/ng-video-lecture gpt.py Head.forward (the 'Let's build GPT' lecture)",
    original="B,T,C = x.shape\nwei = q @ k.transpose(-2,-1) * C**-0.5 # (B, T, C) @ (B, C, T) -> (B, T, T)",
)
def ng_video_lecture_scaled_by_n_embd(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    B, T, C = x.shape
    D = C // n_heads
    outs, weights = [], []
    for h in range(n_heads):  # MultiHeadAttention: one Head per slice of the projections
        cols = slice(h * D, (h + 1) * D)
        k = _project(x, W_k[:, cols], None if b_k is None else b_k[cols])  # self.key(x): (B, T, hs)
        q = _project(x, W_q[:, cols], None if b_q is None else b_q[cols])
        wei = q @ k.transpose(0, 2, 1) * C**-0.5  # BUG: C is n_embd; the head size is D
        if causal:
            wei = np.where(_future(T), -np.inf, wei)  # masked_fill(self.tril[:T, :T] == 0, float('-inf'))
        wei = ref.softmax(wei)  # F.softmax(wei, dim=-1)
        v = _project(x, W_v[:, cols], None if b_v is None else b_v[cols])
        outs.append(wei @ v)
        weights.append(wei)
    out = np.concatenate(outs, axis=-1)  # torch.cat([h(x) for h in self.heads], dim=-1)
    return _project(out, W_o, b_o), np.stack(weights, axis=1)  # self.proj(out); weights (B, H, T, T)


@documented(
    replaces="attention",
    killed_by="attention.multi_head_is_sum_of_heads",
    bug="heads merged with reshape(B, T, d) straight from (B, H, T, D), without permuting back: "
    "each token's output is built from other positions' and other heads' values",
    source="jsbaan/transformer-from-scratch#6",
    also=("jsbaan/transformer-from-scratch#4",),
    project="jsbaan/transformer-from-scratch multi_head_attention.py MultiHeadAttention.forward",
    original="# Concatenate contextualized value vectors from all heads\n"
    "values = values.reshape(batch_size, sequence_length, hidden_dim)",
)
def merge_heads_without_permute(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    batch_size, sequence_length, hidden_dim = x.shape
    q, k, v = (_split(_project(x, W, b), n_heads) for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))  # permute(0, 2, 1, 3)
    attn_logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if causal:
        attn_logits = np.where(_future(sequence_length), -np.inf, attn_logits)  # future_mask
    attn = ref.softmax(attn_logits)
    values = attn @ v  # (B, H, T, D)
    values = values.reshape(batch_size, sequence_length, hidden_dim)  # BUG: no permute(0, 2, 1, 3) first
    return _project(values, W_o, b_o), attn


@documented(
    replaces="attention",
    killed_by="attention.batch_items_independent",
    bug="heads stacked as (H, B, T, D) and concatenated with view(B, T, -1): tokens of one batch item "
    "take values computed for another",
    source="hackiey/QAnet-pytorch#2",
    project="hackiey/QAnet-pytorch qanet/self_attention.py SelfAttention.forward",
    original="heads = torch.zeros(self.n_heads, batch_size, l, self.value_dim, device=device)\n...\n"
    "# concatenation is the same as reshaping our tensor\nx = heads.view(batch_size, l, -1)",
)
def qanet_heads_first_view(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    batch_size, l, d = x.shape
    D = d // n_heads
    heads = np.zeros((n_heads, batch_size, l, D), dtype=x.dtype)
    weights = np.zeros((batch_size, n_heads, l, l), dtype=x.dtype)
    for i in range(n_heads):  # one fc_query/fc_key/fc_value per head: columns i·D:(i+1)·D
        cols = slice(i * D, (i + 1) * D)
        Q = _project(x, W_q[:, cols], None if b_q is None else b_q[cols])
        K = _project(x, W_k[:, cols], None if b_k is None else b_k[cols])
        V = _project(x, W_v[:, cols], None if b_v is None else b_v[cols])
        tmp = Q @ K.transpose(0, 2, 1)  # torch.bmm(Q, K.permute(0,2,1))
        tmp = tmp / math.sqrt(D)
        if causal:  # QANet masks padding only (tmp - 1e30*(1-mask)); the protocol's causal mask goes here
            tmp = np.where(_future(l), -np.inf, tmp)
        tmp = ref.softmax(tmp)
        heads[i] = tmp @ V
        weights[:, i] = tmp
    out = heads.reshape(batch_size, l, -1)  # BUG: x = heads.view(batch_size, l, -1) of an (H, B, l, D) tensor
    return _project(out, W_o, b_o), weights


@documented(
    replaces="attention",
    killed_by="attention.multi_head_is_sum_of_heads",
    bug="heads split with view(B·H, -1, D) straight from (B, T, d), without the transpose: a 'head' is a block of "
    "T/H consecutive tokens' features, so heads mix positions",
    source="reczoo/FuxiCTR#30",
    project="FuxiCTR 1.x fuxictr/pytorch/layers/attention.py MultiHeadAttention (AutoInt, DESTINE, InterHAt)",
    original="query = query.view(batch_size * self.num_heads, -1, self.attention_dim)\n...\n"
    "output = output.view(batch_size, -1, self.output_dim)",
)
def fuxictr_split_heads_view(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    batch_size, T, d = x.shape
    D = d // n_heads
    query, key, value = (_project(x, W, b) for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
    query = query.reshape(batch_size * n_heads, -1, D)  # BUG: no transpose between tokens and heads
    key = key.reshape(batch_size * n_heads, -1, D)
    value = value.reshape(batch_size * n_heads, -1, D)
    scores = query @ key.transpose(0, 2, 1) / math.sqrt(D)  # ScaledDotProductAttention with use_scale
    if causal:  # FuxiCTR's optional mask, here the protocol's causal one
        scores = np.where(_future(T), -np.inf, scores)
    attention = ref.softmax(scores)  # (B·H, T, T)
    output = attention @ value
    output = output.reshape(batch_size, -1, n_heads * D)  # output.view(batch_size, -1, self.output_dim)
    return _project(output, W_o, b_o), attention.reshape(batch_size, n_heads, T, T)


@documented(
    replaces="attention",
    killed_by="attention.causal_non_leakage",
    bug="the causal mask is dropped when no extra attention mask is passed: causal=True attends to the future",
    source="facebookresearch/xformers#103",
    also=("facebookresearch/xformers#104",),
    project="xformers 0.0.x components/attention/scaled_dot_product.py ScaledDotProduct.forward (seq_len not given)",
    original="if self.mask is not None:\n    ...  # merged into att_mask only when att_mask is not None\n"
    "y = scaled_dot_product_attention(q=q, k=k, v=v, att_mask=att_mask, dropout=self.attn_drop, causal=self.causal)",
)
def xformers_causal_mask_skipped(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    q, k, v = (_split(_project(x, W, b), n_heads) for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
    att_mask = None  # self.mask is None (no seq_len at construction) and no att_mask was passed
    att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(k.shape[-1])  # _matmul_with_mask(q, k^T, att_mask=None)
    if att_mask is not None:  # never taken: the causal flag reaches only the triton softmax
        att = att + att_mask
    att = ref.softmax(att)  # _softmax(att, causal): torch.softmax(att, dim=-1) without triton
    return _project(_merge(att @ v), W_o, b_o), att


@documented(
    replaces="attention",
    killed_by="attention.weights_are_distributions",
    bug="attention weights by the naive softmax exp(x) / Σ exp(x): scores past 88.7 overflow float32 to inf, inf/inf = NaN",
    source="pytorch/executorch#18407",
    also=("NVIDIA/FasterTransformer#43",),
    project="ExecuTorch Vulkan SDPA attention-weights softmax shader (Phi-4-mini produced garbage)",
    original="(the fix's description; the shader is GLSL) The SDPA attention weights softmax shader computed naive softmax: "
    "exp(x) / sum(exp(x)).",
    dtype="float32",
)
def executorch_naive_softmax_sdpa(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    T = x.shape[1]
    q, k, v = (_split(_project(x, W, b), n_heads) for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if causal:
        scores = np.where(_future(T), -np.inf, scores)
    e = np.exp(scores)  # BUG: no max pass before the exp_sum pass
    weights = e / e.sum(axis=-1, keepdims=True)
    return _project(_merge(weights @ v), W_o, b_o), weights


@documented(
    replaces="attention",
    killed_by="attention.agrees_with_reference",
    bug="the attention softmax computed with dtype=torch.float32 and cast back to the input's dtype: meant as an upcast "
    "for float16, it caps a float64 model's attention weights at float32's resolution (about 1e-8)",
    source="huggingface/transformers#48459",
    also=("huggingface/transformers#48466",),
    project="transformers 5.14 GPT-NeoX eager_attention_forward (ViT's eager attention in 5.24 has the same line)",
    original="attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)",
    backend="torch",
)
def gpt_neox_float32_softmax(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    import torch
    from torch import nn

    B, T, d = x.shape
    head_size = d // n_heads

    def heads(W, b):  # the protocol's x @ W + b, viewed (B, T, H, D) and transposed to (B, H, T, D)
        return (x @ W if b is None else x @ W + b).view(B, T, n_heads, head_size).transpose(1, 2)

    query, key, value = heads(W_q, b_q), heads(W_k, b_k), heads(W_v, b_v)
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * head_size**-0.5  # scaling = head_size ** -0.5
    if causal:  # the model's causal mask, added to the scores
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        attn_weights = attn_weights.masked_fill(future, float("-inf"))
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)  # BUG: float32 for float64 too
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).reshape(B, T, d)  # (B, T, d)
    return (attn_output @ W_o if b_o is None else attn_output @ W_o + b_o), attn_weights


# ---------------------------------------------------------------------------------------------
# The block
# ---------------------------------------------------------------------------------------------


def _biases(p):
    return {name: p[name] for name in ref.ATTENTION_BIAS_NAMES if name in p}


@documented(
    replaces="transformer_block",
    killed_by="block.residual_identity",
    bug="pre-norm with the residual taken after the norm (src = norm1(src); src = src + attn(src)): "
    "the skip connection carries LN(x), not x",
    source="pytorch/pytorch#61165",
    also=("pytorch/pytorch#60593", "Howuhh/faster-trajectory-transformer#3", "tracel-ai/burn#1056"),
    project="PyTorch nn.TransformerEncoderLayer(norm_first=True) as added by pytorch/pytorch#60593",
    original="(torch/nn/modules/transformer.py, as the issue quotes it)\nif self.norm_first:\n    src = self.norm1(src)\n"
    "    src2 = self.self_attn(src, src, src, ...)[0]\n"
    "    src = src + self.dropout1(src2)\n    src = self.norm2(src)\n"
    "    src2 = self.linear2(self.dropout(self.activation(self.linear1(src))))\n    src = src + self.dropout2(src2)",
)
def torch_norm_first_residual_after_norm(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=ref.EPS):
    p = params
    src = ref.layer_norm(x, p["ln1_g"], p["ln1_b"], eps)  # BUG: the input is overwritten by its norm
    src2, _ = ref.attention(src, p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal, **_biases(p))
    src = src + src2
    src = ref.layer_norm(src, p["ln2_g"], p["ln2_b"], eps)  # BUG: again
    src2 = ref.feed_forward(src, p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)
    return src + src2


@documented(
    replaces="transformer_block",
    killed_by="block.residual_identity",
    bug="the attention residual written x = x + x after x was overwritten by the attention output: "
    "the skip connection is lost and the attention output doubled",
    source="kyegomez/BitNet#32",
    project="kyegomez/BitNet bitnet/bit_transformer.py Transformer.forward",
    original="x, _ = attn(x, x, x, is_causal=True, *args, **kwargs)\nx = x + x\nx = ffn(x) + x",
)
def bitnet_residual_doubled(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=ref.EPS):
    p = params
    normed = ref.layer_norm(x, p["ln1_g"], p["ln1_b"], eps)  # BitNet's BitLinear norms its input; the protocol's ln1
    x, _ = ref.attention(normed, p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal, **_biases(p))
    x = x + x  # BUG: meant x = x + attn(x)
    return ref.feed_forward(ref.layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form) + x


# ---------------------------------------------------------------------------------------------
# Mixture of experts
# ---------------------------------------------------------------------------------------------


@documented(
    replaces="top_k_gates",
    killed_by="moe.top_k_gates_sum_to_one",
    bug="softmax over all experts, top-k, and the kept probabilities used as gates without renormalising "
    "(HF and DeepSeek's reference renormalise: norm_topk_prob)",
    source="pytorch/torchtitan#1448",
    project="torchtitan DeepSeek-V3 TokenChoiceTopKRouter.forward (softmax scoring)",
    original="scores = F.softmax(scores.to(torch.float32), dim=1)\n"
    "top_scores, selected_experts_indices = torch.topk(scores, k=self.top_k, dim=1)\n"
    "if self.use_sigmoid:\n    denominator = top_scores.sum(dim=-1, keepdim=True) + 1e-20\n    top_scores = top_scores / denominator",
    backend="torch",
)
def torchtitan_unnormalised_top_k(router_logits, k):
    import torch
    import torch.nn.functional as F

    scores = F.softmax(router_logits.to(torch.float32), dim=1)  # float32 "to avoid loss explosion", as shipped
    top_scores, selected_experts_indices = torch.topk(scores, k=k, dim=1)
    # BUG: only the sigmoid path divides by top_scores.sum(dim=-1, keepdim=True) + 1e-20
    return torch.zeros_like(router_logits).scatter(-1, selected_experts_indices, top_scores.to(router_logits.dtype))


@documented(
    replaces="top_k_gates",
    killed_by="moe.top_k_gates_sum_to_one",
    bug="with top_k = 1 the router takes scores.max(dim=-1), whose weights have shape (N,), so the p-norm "
    "normalisation divides by a norm over all tokens instead of over each token's k weights",
    source="databricks/megablocks#87",
    project="MegaBlocks LearnedRouter (moe_normalize_expert_weights=1, moe_top_k=1)",
    original="def _top_k(self, scores):\n    if self.args.moe_top_k == 1:\n        return scores.max(dim=-1)\n"
    "...\nexpert_weights /= torch.norm(expert_weights, p=self.args.moe_normalize_expert_weights, dim=-1, keepdim=True)",
    backend="torch",
)
def megablocks_top1_normalised_over_tokens(router_logits, k):
    import torch

    scores = router_logits.softmax(dim=-1)
    if k == 1:
        expert_weights, expert_indices = scores.max(dim=-1)  # BUG: (N,), not (N, 1)
    else:
        expert_weights, expert_indices = torch.topk(scores, k, dim=-1)
    expert_weights = expert_weights / torch.norm(expert_weights, p=1, dim=-1, keepdim=True)  # across tokens when k = 1
    if k == 1:
        expert_weights, expert_indices = expert_weights[:, None], expert_indices[:, None]
    return torch.zeros_like(router_logits).scatter(-1, expert_indices, expert_weights)


@documented(
    replaces="load_balancing_loss",
    killed_by="moe.load_balancing_loss_uniform_mean_is_one",
    bug="Mixtral's first balance loss: P from the top-k weights (softmax over the kept logits, which sum to 1 per token), "
    "averaged over the k slots, so the loss is n/k whatever the routing",
    source="huggingface/transformers#28021",
    also=("huggingface/transformers#28255", "huggingface/transformers#28256"),
    project="transformers 4.36.0 models/mixtral/modeling_mixtral.py load_balancing_loss_func",
    original="routing_weights, selected_experts = torch.topk(gate_logits, top_k, dim=-1)\n"
    "routing_weights = routing_weights.softmax(dim=-1)\n...\n"
    "tokens_per_group_and_expert = torch.mean(expert_mask, axis=-2)\n"
    "router_prob_per_group_and_expert = torch.mean(routing_weights, axis=-1)\n"
    "return torch.mean(tokens_per_group_and_expert * router_prob_per_group_and_expert.unsqueeze(-1)) * (num_experts**2)",
    backend="torch",
)
def mixtral_4_36_balance_loss(router_logits, k):
    import torch

    num_experts = router_logits.shape[-1]
    routing_weights, selected_experts = torch.topk(router_logits, k, dim=-1)
    routing_weights = routing_weights.softmax(dim=-1)  # BUG: the top-k weights, not the full softmax
    selected_experts = selected_experts.unsqueeze(2)  # (N, k, 1)
    expert_mask = torch.nn.functional.one_hot(selected_experts, num_experts)  # (N, k, 1, E)
    expert_mask = torch.max(expert_mask, axis=-2).values  # (N, k, E)
    expert_mask = expert_mask.to(router_logits.dtype)  # the original casts to float32 "otherwise mean will fail"
    tokens_per_group_and_expert = torch.mean(expert_mask, axis=-2)  # (N, E)
    router_prob_per_group_and_expert = torch.mean(routing_weights, axis=-1)  # BUG: (N,), always 1/k
    return torch.mean(tokens_per_group_and_expert * router_prob_per_group_and_expert.unsqueeze(-1)) * (num_experts**2)


@documented(
    replaces="load_balancing_loss",
    killed_by="moe.load_balancing_loss_agrees_with_reference",
    bug="the router returns softmax probabilities as router_logits and the balance loss applies softmax again: "
    "P = mean softmax(softmax(logits)), flattened toward uniform",
    source="huggingface/transformers#45120",
    also=("huggingface/transformers#45111", "huggingface/transformers#45132"),
    project="transformers 5.x MixtralTopKRouter / Qwen2MoeTopKRouter (and the models generated from them) with load_balancing_loss_func",
    original="(the issue's description) the routers apply softmax to the raw logits in forward() and return the result as "
    "router_logits; load_balancing_loss_func then computes\n"
    "routing_weights = torch.nn.functional.softmax(concatenated_gate_logits, dim=-1)",
    backend="torch",
)
def double_softmax_balance_loss(router_logits, k):
    import torch

    import invariants.reference.torch as ref_torch

    N, E = router_logits.shape
    router_logits = torch.nn.functional.softmax(router_logits, dim=-1)  # BUG: the router hands back probabilities
    routing_weights = torch.nn.functional.softmax(router_logits, dim=-1)  # ... and the loss softmaxes them again
    f = ref_torch.tokens_per_expert(router_logits, k).to(router_logits.dtype) / (N * k)  # same top-k: softmax is monotone
    P = routing_weights.mean(dim=0)
    return E * torch.sum(f * P)  # Switch's normalisation (the adapter's conversion of Mixtral's k × loss)


# ---------------------------------------------------------------------------------------------
# Negative controls: reported as bugs, equivalent in fact. The suite must pass every one.
# ---------------------------------------------------------------------------------------------


@equivalent(
    replaces="top_k_gates",
    bug="reported: Mixtral (HF) takes the softmax over all experts, then top-k, then renormalises, "
    "where the paper and Mistral's reference take top-k of the logits, then the softmax",
    source="Lightning-AI/litgpt#1286",
    also=("Lightning-AI/litgpt#2013", "ServiceNow/Fast-LLM#190", "NVIDIA/TensorRT-LLM#2752", "NVIDIA/Megatron-LM#955"),
    project="transformers MixtralSparseMoeBlock.forward",
    original="routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)\n"
    "routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)\n"
    "routing_weights /= routing_weights.sum(dim=-1, keepdim=True)",
    why="softmax is monotone, so top-k of the probabilities picks the same experts as top-k of the logits, and "
    "p_i / Σ_kept p_j = e^{r_i} / Σ_kept e^{r_j}: the softmax's denominator cancels (Fast-LLM#190: 'the first two "
    "items result in the same weights'; TensorRT-LLM#2752: 'the extra division makes this equivalent'). torch.topk "
    "is replaced by the reference's stable top-k: its tie order is a separate, declared convention (TOP_K_TIES)",
    backend="torch",
)
def hf_mixtral_softmax_topk_renormalise(router_logits, k):
    import torch.nn.functional as F

    import invariants.reference.torch as ref_torch

    routing_weights = F.softmax(router_logits, dim=1)
    selected_experts = ref_torch.top_k_indices(routing_weights, k)  # torch.topk, with the documented tie rule
    routing_weights = routing_weights.gather(-1, selected_experts)
    routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    return routing_weights.new_zeros(router_logits.shape).scatter(-1, selected_experts, routing_weights)


@equivalent(
    replaces="attention",
    bug="reported: the queries are divided by the temperature √d_k before q·kᵀ, where the paper scales the product",
    source="jadore801120/attention-is-all-you-need-pytorch#177",
    project="attention-is-all-you-need-pytorch transformer/Modules.py ScaledDotProductAttention.forward",
    original="attn = torch.matmul(q / self.temperature, k.transpose(2, 3))",
    why="the temperature is a scalar, so (q/τ)·kᵀ = (q·kᵀ)/τ; in floating point the two differ only by rounding",
)
def jadore_temperature_before_matmul(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    T = x.shape[1]
    q, k, v = (_split(_project(x, W, b), n_heads) for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
    temperature = math.sqrt(q.shape[-1])  # d_k ** 0.5
    attn = (q / temperature) @ k.transpose(0, 1, 3, 2)  # torch.matmul(q / self.temperature, k.transpose(2, 3))
    if causal:
        attn = np.where(_future(T), -np.inf, attn)  # attn.masked_fill(mask == 0, -1e9) in the original; -inf here
    attn = ref.softmax(attn)
    return _project(_merge(attn @ v), W_o, b_o), attn


@equivalent(
    replaces="rms_norm",
    bug="reported: T5LayerNorm computes the variance without subtracting the mean",
    source="huggingface/transformers#14772",
    project="transformers T5LayerNorm.forward (also LlamaRMSNorm, MixtralRMSNorm)",
    original="variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)\n"
    "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)",
    why="T5's norm is RMSNorm by design (no centring, no bias): 'assuming that the mean is 0 this is actually the "
    "correct formula'; x·rsqrt(mean(x²) + ε)·w is x/√(mean(x²) + ε)·w (run in float32, the dtype T5 computes the "
    "variance in)",
    backend="torch",
    dtype="float32",
)
def t5_layer_norm_without_mean(x, gain, eps=1e-5):
    import torch

    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return gain * x


@equivalent(
    replaces="gelu",
    bug="reported: the README's GELU squares x where the implementations cube it",
    source="hendrycks/GELUs#1",
    project="hendrycks/GELUs README (the tanh approximation, Horner's form)",
    original="0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))",
    why="x·(1 + 0.044715·x²) = x + 0.044715·x³ (Horner's method, as the author answered); 0.7978845608 is √(2/π) "
    "to 10 digits",
)
def hendrycks_gelu_horner(x):
    return 0.5 * x * (1 + np.tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))
