"""invariants.boundary.to_backend: the values an implementation receives, in the dtypes and structure it was promised."""

import warnings

import numpy as np
import pytest

from invariants.boundary import OutputError, rounded, to_backend, to_numpy

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_floats_arrive_in_the_run_dtype_with_their_rounded_values(dtype):
    x = rounded(np.array([[0.1, -2.5], [3.0, 1e-3]]), dtype)  # (2, 2)
    tensor = to_backend(x, backend="torch", dtype=dtype)
    assert tensor.dtype == getattr(torch, dtype) and tensor.shape == (2, 2)
    assert np.array_equal(tensor.float().numpy(), x.astype(np.float32))  # rounded() already holds the dtype's values


def test_integers_booleans_and_structure_are_kept():
    sent = {"ids": np.array([[1, 2]], dtype=np.int32), "mask": np.array([True, False]), "blocks": [np.zeros(2), (np.ones(()), 3)]}
    got = to_backend(sent, backend="torch", dtype="float32")
    assert got["ids"].dtype == torch.int64 and got["mask"].dtype == torch.bool
    assert isinstance(got["blocks"], list) and isinstance(got["blocks"][1], tuple) and got["blocks"][1][1] == 3
    assert got["blocks"][1][0].shape == () and got["blocks"][0].dtype == torch.float32  # a 0-d array stays 0-d


def test_a_read_only_array_is_copied_so_the_implementation_cannot_write_into_it():
    frozen = np.array([True, False, True])
    frozen.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when a tensor would share a read-only array's memory
        tensor = to_backend(frozen, backend="torch")
    tensor[0] = False  # an implementation that writes into its argument
    assert frozen[0]


def test_requires_grad_and_the_numpy_backend():
    x = np.arange(3.0)
    assert to_backend(x, backend="torch", requires_grad=True).requires_grad
    assert to_backend(x, backend="numpy") is x


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", ">f8"])
def test_real_float_answers_cross_in_their_own_dtype(dtype):
    answer = to_numpy(np.ones(2, dtype=dtype), "attention")
    assert answer.dtype == np.dtype(dtype) and type(answer) is np.ndarray


@pytest.mark.parametrize("dtype", [np.longdouble, np.complex128, object])
def test_other_answers_are_an_output_error_that_names_the_function(dtype):
    if np.dtype(dtype).itemsize == 8 and np.dtype(dtype).kind == "f":
        pytest.skip("longdouble is float64 on this platform")
    with pytest.raises(OutputError, match="attention returned an array of dtype"):
        to_numpy(np.ones(2, dtype=dtype), "attention")
