"""Hypothesis strategies for transformer components: shapes, weights, well-posed inputs, dtypes.

Importable by anyone testing their own implementation; every strategy validates its
arguments and says in its docstring where its inputs keep a property well-posed.
"""

from strategies._validation import InvalidArgument
from strategies.core import AttentionShape, attention_shapes, devices, dtypes, float_arrays, seeds, weights
from strategies.norms import gains_and_biases, norm_rows, scale_factors

__all__ = [
    "AttentionShape", "InvalidArgument",
    "attention_shapes", "devices", "dtypes", "float_arrays", "gains_and_biases", "norm_rows", "scale_factors", "seeds", "weights",
]
