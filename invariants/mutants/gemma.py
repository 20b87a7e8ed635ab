"""Broken Gemma details as shipped: each a bug that reached a release of transformers, Gemma's own PyTorch code or a port (cited)."""

import math

import numpy as np
import torch

from invariants.mutants import mutant
from invariants.reference.numpy import gelu_erf


@mutant(
    also_named_by=("gemma.geglu_agrees_with_reference",),
    replaces="geglu",
    killed_by="gemma.geglu_tanh_form",
    dtype="float32",
    bug="Gemma's MLP with the exact GELU, not the tanh form it was trained with (huggingface/transformers#29402, mlc-ai/mlc-llm#2106, "
    "NVIDIA-NeMo/Megatron-Bridge#4661)",
)
def exact_gelu_geglu(x, W_gate, W_up, W_down):
    return (gelu_erf(x @ W_gate) * (x @ W_up)) @ W_down  # BUG: erf, not tanh


@mutant(
    also_named_by=("gemma.gemma_rms_norm_agrees_with_reference",),
    replaces="gemma_rms_norm",
    killed_by="gemma.gemma_rms_norm_zero_weight",
    bug="a Llama RMSNorm run on Gemma's weights: the gain w, not 1 + w (linkedin/Liger-Kernel#74, pytorch/executorch#19901)",
)
def llama_gain_gemma_rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w  # BUG: w, not 1 + w


@mutant(
    replaces="gemma_rms_norm",
    killed_by="gemma.gemma_rms_norm_rounded_once",
    backend="torch",
    dtype="bfloat16",
    bug="the normalised x cast to bfloat16 before the gain, Llama's order (google/gemma_pytorch#67, huggingface/transformers#29402)",
)
def cast_first_gemma_rms_norm(x, w, eps):
    y = x.float()
    normed = (y / torch.sqrt((y * y).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)  # BUG: rounded before the gain
    return (1 + w) * normed


@mutant(
    replaces="scaled_embedding",
    killed_by="gemma.scaled_embedding_exact",
    backend="torch",
    dtype="bfloat16",
    bug="the embedding normaliser √d kept in float32 (a Python float times the bfloat16 rows): 55.43, not Gemma's 55.5 "
    "(huggingface/transformers#29402, google/gemma_pytorch#67)",
)
def float32_normaliser_scaled_embedding(ids, table):
    return table[ids] * math.sqrt(table.shape[-1])  # BUG: torch multiplies in float32, then rounds


@mutant(
    replaces="scaled_embedding",
    killed_by="gemma.scaled_embedding_exact",
    bug="the embedding never multiplied by √d_model (SamLynnEvans/Transformer#10)",
)
def unscaled_embedding(ids, table):
    return table[ids]  # BUG: no normaliser
