"""Dtype honesty: floating answers keep the input dtype; numpy float64 leaks are caught in float32, torch default-dtype leaks in float64."""

from pathlib import Path

import numpy as np
import pytest

import invariants.runner as runner
from invariants import Implementation, all_invariants, load_implementation, run_invariant
from invariants.inputs import VALID_INPUTS
from invariants.laws.dtypes import COMMON_CAUSES, NOT_FLOATING, answer_dtype
from invariants.mutants import MUTANTS, all_mutants
from invariants.profiles import profile_settings
from invariants.protocol import FUNCTIONS
from invariants.registry import REGISTRY

torch = pytest.importorskip("torch")

DTYPE_INVARIANTS = [inv for inv in all_invariants() if inv.component == "dtypes"]
all_mutants()
CI = profile_settings("ci")


def _run(inv, impl):
    """(status, report) of run_invariant, whichever API it has: an Outcome, or the raising one (a count, or an exception)."""
    try:
        result = run_invariant(inv, impl, settings=CI)
    except runner.InvariantSkipped as skipped:
        return "skipped", str(skipped)
    except AssertionError as failure:  # the raising API's InvariantFailure is an AssertionError with a kind
        if getattr(failure, "kind", None) is None:
            raise
        return ("failed" if failure.kind == "violation" else "error"), str(failure)
    if hasattr(result, "status"):
        return result.status, result.report or result.reason
    return "passed", ""


def _status(inv, impl):
    return _run(inv, impl)[0]


def _torch(dtype, **functions):
    return Implementation.from_functions(backend="torch", dtype=dtype, label="test functions", **functions)


def test_every_floating_protocol_function_has_a_dtype_invariant():
    checked = {inv.requires[0] for inv in DTYPE_INVARIANTS}
    assert all(len(inv.requires) == 1 for inv in DTYPE_INVARIANTS)  # one function each: a partial implementation skips exactly
    assert checked.isdisjoint(NOT_FLOATING)
    assert checked | set(NOT_FLOATING) == set(FUNCTIONS), sorted(set(FUNCTIONS) - checked - set(NOT_FLOATING))
    assert checked <= set(VALID_INPUTS)  # the entry's valid inputs, which the law over the table draws
    for inv in DTYPE_INVARIANTS:
        assert inv.name == f"dtypes.{inv.requires[0]}_keeps_dtype"
        assert inv.hint.endswith(f"; the leaks every function shares: {COMMON_CAUSES}"), inv.name  # after its own leak


def test_the_shared_leaks_are_in_the_docs_section_every_dtype_hint_points_to():
    page, section = COMMON_CAUSES.split("#")
    text = (Path(__file__).resolve().parent.parent / page).read_text()
    assert section == "where-a-dtype-leaks" and "\n## Where a dtype leaks\n" in text
    shared = text.split("\n## Where a dtype leaks\n")[1]
    assert all(cause in shared for cause in ("np.float64(eps)", "np.sqrt(d)", "torch's default dtype", ".double()", ".item()")), shared


@pytest.mark.parametrize(
    "backend, dtype, expected",
    [("numpy", "float64", np.float64), ("numpy", "float32", np.float32), ("numpy", "float16", np.float16),
     ("torch", "float64", np.float64), ("torch", "float32", np.float32), ("torch", "float16", np.float16),
     ("torch", "bfloat16", np.float32)],  # numpy has no bfloat16: the answer is widened to float32, exactly
)
def test_answer_dtype_is_the_run_dtype_with_bfloat16_carried_as_float32(backend, dtype, expected):
    impl = Implementation.from_functions(backend=backend, dtype=dtype, gelu=lambda x: x)
    assert answer_dtype(impl) == np.dtype(expected)


CONFIGS = [("reference.numpy", "float64"), ("reference.numpy", "float32"), ("reference.numpy", "float16"),
           ("reference.torch", "float64"), ("reference.torch", "float32"), ("reference.torch", "bfloat16"),
           ("reference.torch", "float16")]


@pytest.mark.parametrize("target, dtype", CONFIGS, ids=lambda v: v)
def test_the_references_keep_the_dtype_everywhere(target, dtype):
    impl = load_implementation(target, dtype=dtype)
    results = {inv.name: _run(inv, impl) for inv in DTYPE_INVARIANTS}
    assert {name: status for name, (status, _) in results.items() if status != "passed"} == {}, \
        "\n\n".join(report for status, report in results.values() if status != "passed")


@pytest.mark.parametrize("adapter", ["torch_sdpa", "torch_mha"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_attention_adapters_keep_the_dtype(adapter, dtype):
    assert _status(REGISTRY["dtypes.attention_keeps_dtype"], load_implementation(f"invariants.adapters.{adapter}", dtype=dtype)) == "passed"


FLOAT64_LEAKS = [m for m in MUTANTS.values() if m.name.startswith("dtypes.") and m.backend == "numpy"]


def test_the_zoo_has_numpy_float64_leaks_that_run_in_float32():
    assert len(FLOAT64_LEAKS) >= 1
    assert all(m.implementation().dtype == "float32" for m in FLOAT64_LEAKS)  # where the kill matrix and test_mutants see them


@pytest.mark.parametrize("mutant", FLOAT64_LEAKS, ids=lambda m: m.name)
def test_a_numpy_float64_leak_is_killed_in_float32_and_invisible_in_float64(mutant):
    inv = REGISTRY[mutant.killed_by]
    status, report = _run(inv, mutant.implementation(dtype="float32"))
    assert status == "failed", report
    function = inv.requires[0]
    assert f"dtype of {FUNCTIONS[function].signature}" in report and "=float64, but should be float32 (the input dtype)" in report
    assert f"hint: {inv.hint}" in report
    assert _status(inv, mutant.implementation(dtype="float64")) == "passed"  # float64 in, float64 out: nothing to see


def test_the_layer_norm_leak_report_names_the_function_and_both_dtypes():
    mutant = MUTANTS["dtypes.float64_eps_layer_norm"]
    _, report = _run(REGISTRY[mutant.killed_by], mutant.implementation())
    assert ("dtype of layer_norm(x, gain, bias, eps)=float64, but should be float32 (the input dtype) "
            "[layer_norm(x[") in report and "] float32, gain[" in report
    assert "eps=1e-05)]" in report


def test_a_default_dtype_torch_buffer_is_killed_in_float64_and_bfloat16_but_not_float32():
    mutant = MUTANTS["dtypes.default_dtype_buffer_moe"]
    inv = REGISTRY[mutant.killed_by]
    status, report = _run(inv, mutant.implementation())  # float64, as every ordinary mutant
    assert status == "failed" and "dtype of moe(x, router, experts, k)=float32, but should be float64 (the input dtype)" in report
    status, report = _run(inv, mutant.implementation(dtype="bfloat16"))  # the answer is float32: off the bfloat16 grid
    assert status == "failed" and "but should be a bfloat16 number" in report, report
    assert _status(inv, mutant.implementation(dtype="float32")) == "passed"  # the default dtype happens to be the input's


def test_a_bfloat16_run_catches_float32_and_float64_answers():
    def upcast_layer_norm(x, gain, bias, eps):  # accumulates in float32 and forgets to round back
        return torch.nn.functional.layer_norm(x.float(), x.shape[-1:], gain.float(), bias.float(), eps)

    def double_layer_norm(x, gain, bias, eps):
        return torch.nn.functional.layer_norm(x.double(), x.shape[-1:], gain.double(), bias.double(), eps)

    inv = REGISTRY["dtypes.layer_norm_keeps_dtype"]
    status, report = _run(inv, _torch("bfloat16", layer_norm=upcast_layer_norm))
    assert status == "failed" and "but should be a bfloat16 number (the answer was computed or kept in float32" in report, report
    status, report = _run(inv, _torch("bfloat16", layer_norm=double_layer_norm))
    assert status == "failed", report
    assert "=float64, but should be float32 (the input dtype bfloat16, which numpy carries as float32)" in report
    rounded = _torch("bfloat16", layer_norm=lambda x, g, b, eps: upcast_layer_norm(x, g, b, eps).to(x.dtype))
    assert _status(inv, rounded) == "passed"


def test_scalar_answers_must_be_arrays_of_the_dtype_not_python_floats():
    import invariants.reference.torch as ref

    inv = REGISTRY["dtypes.cross_entropy_keeps_dtype"]
    status, report = _run(inv, _torch("float32", cross_entropy=lambda logits, t: ref.cross_entropy(logits, t).item()))
    assert status == "failed" and "dtype of cross_entropy(logits, targets)=float64, but should be float32" in report, report
    assert _status(inv, _torch("float32", cross_entropy=ref.cross_entropy)) == "passed"  # a 0-d float32 tensor
    numpy_loss = Implementation.from_functions(backend="numpy", dtype="float32", cross_entropy=lambda logits, t: np.float32(1.5))
    assert _status(inv, numpy_loss) == "passed"  # a numpy float32 scalar is a 0-d float32 answer


def test_attention_checks_both_outputs():
    import invariants.reference.torch as ref

    def double_weights(*args):
        out, weights = ref.attention(*args)
        return out, weights.double()

    status, report = _run(REGISTRY["dtypes.attention_keeps_dtype"], _torch("float32", attention=double_weights))
    assert status == "failed"
    assert "dtype of attention(x, W_q, W_k, W_v, W_o, n_heads, causal)[1] (weights)=float64, but should be float32" in report


def test_a_partial_implementation_skips_only_what_it_lacks():
    impl = Implementation.from_functions(backend="numpy", dtype="float32", gelu=lambda x: x)
    statuses = {inv.name: _status(inv, impl) for inv in DTYPE_INVARIANTS}
    assert statuses.pop("dtypes.gelu_keeps_dtype") == "passed"
    assert set(statuses.values()) == {"skipped"}


def test_an_attention_without_weights_is_checked_on_its_output_alone():
    import invariants.reference.torch as ref

    def out_only(*args):
        return ref.attention(*args)[0]

    namespace = type("OutOnly", (), {"ATTENTION_WEIGHTS": False, "attention": staticmethod(out_only)})
    impl = Implementation(namespace, label="out-only attention", backend="torch", dtype="bfloat16")
    assert _status(REGISTRY["dtypes.attention_keeps_dtype"], impl) == "passed"
