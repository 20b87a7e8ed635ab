"""Broken GELU: a flipped sign, wrong constants, a missing factor, ReLU in its place."""

import numpy as np

from invariants.mutants import mutant

C = np.sqrt(2.0 / np.pi)


@mutant(replaces="gelu", killed_by="activation.gelu_between_relu_bounds", bug="sign flipped: 0.5·x·(1 - tanh(...))")
def gelu_sign_flipped(x):
    return 0.5 * x * (1.0 - np.tanh(C * (x + 0.044715 * x**3)))


@mutant(replaces="gelu", killed_by="activation.gelu_close_to_erf_form", bug="cubic coefficient 0.44715 instead of 0.044715")
def gelu_cubic_constant_off(x):
    return 0.5 * x * (1.0 + np.tanh(C * (x + 0.44715 * x**3)))


@mutant(replaces="gelu", killed_by="activation.gelu_close_to_erf_form", bug="√(π/2) instead of √(2/π)")
def gelu_inverted_square_root(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(np.pi / 2.0) * (x + 0.044715 * x**3)))


@mutant(replaces="gelu", killed_by="activation.gelu_known_values", bug="ReLU in place of GELU")
def relu_instead_of_gelu(x):
    return np.maximum(x, 0.0)


@mutant(replaces="gelu", killed_by="activation.gelu_odd_part_is_identity", bug="the 0.5 is dropped: x·(1 + tanh(...))")
def gelu_without_half(x):
    return x * (1.0 + np.tanh(C * (x + 0.044715 * x**3)))


@mutant(replaces="gelu", killed_by="activation.gelu_zero_is_zero", bug="returns the gate Φ(x) without multiplying by x")
def gelu_gate_only(x):
    return 0.5 * (1.0 + np.tanh(C * (x + 0.044715 * x**3)))
