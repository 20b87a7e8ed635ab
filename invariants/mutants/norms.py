"""Broken norms: the variance, eps and axis bugs the lesson warns about."""

import numpy as np

from invariants.mutants import mutant


@mutant(replaces="layer_norm", killed_by="norms.layer_norm_known_values", bug="unbiased variance (divides by d - 1)")
def unbiased_layer_norm(x, gain, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, ddof=1, keepdims=True) + eps) * gain + bias


@mutant(also_named_by=("norms.layer_norm_known_values",),
        replaces="layer_norm", killed_by="norms.layer_norm_scale_law", bug="eps outside the square root")
def eps_outside_layer_norm(x, gain, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / (np.sqrt(x.var(axis=-1, keepdims=True)) + eps) * gain + bias


@mutant(also_named_by=("norms.layer_norm_known_values",),
        replaces="layer_norm", killed_by="norms.layer_norm_rows_independent", bug="statistics over the batch and sequence axes (BatchNorm)")
def pooled_layer_norm(x, gain, bias, eps=1e-5):
    axes = tuple(range(x.ndim - 1)) or (-1,)
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axes, keepdims=True) + eps) * gain + bias


@mutant(replaces="layer_norm", killed_by="norms.layer_norm_affine", bug="bias dropped")
def biasless_layer_norm(x, gain, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + eps) * gain


@mutant(replaces="rms_norm", killed_by="norms.rms_norm_scale_law", bug="rms_norm with eps outside the square root")
def eps_outside_rms_norm(x, gain, eps=1e-5):
    return x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + eps) * gain


@mutant(
    replaces="rms_norm",
    killed_by="norms.rms_norm_large_rows",
    bug="mean(x²) taken in float16 (no upcast): x² overflows for |x| >= 256 and the output collapses to 0",
    backend="torch",
    dtype="float16",
)
def rms_norm_squares_in_float16(x, gain, eps=1e-5):
    import torch

    mean_square = (x * x).mean(dim=-1, keepdim=True)  # BUG: in x's float16, inf past |x| ≈ 256
    return x / torch.sqrt(mean_square + eps) * gain


@mutant(
    replaces="layer_norm",
    killed_by="norms.layer_norm_large_rows",
    bug="the variance taken in float16 (no upcast): (x - μ)² overflows for spreads past 256 and the output collapses to b",
    backend="torch",
    dtype="float16",
)
def layer_norm_variance_in_float16(x, gain, bias, eps=1e-5):
    import torch

    centred = x - x.mean(dim=-1, keepdim=True)
    var = (centred * centred).mean(dim=-1, keepdim=True)  # BUG: in x's float16
    return centred / torch.sqrt(var + eps) * gain + bias
