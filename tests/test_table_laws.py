"""The shape and finiteness laws written once over the protocol table: true on both references, each failing the slip it names."""

import numpy as np
import pytest

from invariants import Implementation, all_invariants, load_implementation, run_invariant
from invariants.laws.finite import ANSWER_FINITE
from invariants.laws.shapes import ANSWER_SHAPE
from invariants.profiles import profile_settings
from invariants.protocol import FUNCTIONS
from invariants.registry import REGISTRY

torch = pytest.importorskip("torch")

TABLE_LAWS = [inv for inv in all_invariants() if inv.component in ("shapes", "finite")]
CI = profile_settings("ci")
FLOATING = sorted(name for name, entry in FUNCTIONS.items() if entry.floating)
ARRAYS = sorted(name for name, entry in FUNCTIONS.items() if entry.answers_arrays)  # the floating ones, ids and counts
CONFIGS = [("reference.numpy", "float64"), ("reference.numpy", "float32"), ("reference.numpy", "float16"),
           ("reference.torch", "float64"), ("reference.torch", "float32"), ("reference.torch", "bfloat16"),
           ("reference.torch", "float16")]


def _run(inv, impl):
    outcome = run_invariant(inv, impl, settings=CI)
    return outcome.status, outcome.report or outcome.reason or ""


def test_a_shape_law_per_entry_that_answers_arrays_and_a_finiteness_law_per_floating_one():
    assert sorted(ANSWER_SHAPE) == ARRAYS and sorted(ANSWER_FINITE) == FLOATING
    for name in ARRAYS:
        assert ANSWER_SHAPE[name].name == f"shapes.{name}_answer_shape" and ANSWER_SHAPE[name].requires == (name,)
    for name in FLOATING:
        assert ANSWER_FINITE[name].name == f"finite.{name}_answer_finite" and ANSWER_FINITE[name].requires == (name,)


@pytest.mark.parametrize("target, dtype", CONFIGS, ids=lambda v: v)
def test_the_references_pass_every_table_law(target, dtype):
    impl = load_implementation(target, dtype=dtype)
    results = {inv.name: _run(inv, impl) for inv in TABLE_LAWS}
    assert {name: status for name, (status, _) in results.items() if status != "passed"} == {}, \
        "\n\n".join(report for status, report in results.values() if status != "passed")


def _first(answer):
    """(the first part of an answer, a function putting a new first part back)."""
    if isinstance(answer, tuple):
        return answer[0], lambda part: (part, *answer[1:])
    return answer, lambda part: part


def _wrong_shape(function):
    def wrapped(*args):
        first, rebuilt = _first(function(*args))
        stack = torch.stack if isinstance(first, torch.Tensor) else np.stack  # reference.torch's text functions answer numpy
        return rebuilt(stack([first, first]))  # one more leading axis: (2, ...), a scalar becomes (2,)

    return wrapped


def _one_nan(backend, function):
    def wrapped(*args):
        first, rebuilt = _first(function(*args))
        first = np.array(first) if backend == "numpy" else first.detach().clone()  # a numpy scalar becomes a 0-d array
        first.reshape(-1)[0] = float("nan")  # the first part is floating in every entry
        return rebuilt(first)

    return wrapped


def _reference(backend, name):
    return getattr(load_implementation(f"reference.{backend}").namespace, name)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name", ARRAYS)
def test_a_wrong_shape_fails_the_shape_law(name, backend):
    wrong = _wrong_shape(_reference(backend, name))
    status, report = _run(ANSWER_SHAPE[name], Implementation.from_functions(backend=backend, **{name: wrong}))
    assert status == "failed" and f"shape of {FUNCTIONS[name].signature}" in report and "=(2," in report, report


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name", FLOATING)
def test_a_nan_fails_the_finiteness_law(name, backend):
    nan = _one_nan(backend, _reference(backend, name))
    status, report = _run(ANSWER_FINITE[name], Implementation.from_functions(backend=backend, **{name: nan}))
    assert status == "failed" and "=nan, but should be finite" in report, report
    assert f"hint: {ANSWER_FINITE[name].hint}" in report


class _OutOnly:
    """reference.numpy's attention under ATTENTION_WEIGHTS = False, answering `out` alone (or, wrongly, the tuple)."""

    BACKEND = "numpy"
    ATTENTION_WEIGHTS = False

    def __init__(self, with_weights):
        self.with_weights = with_weights

    def attention(self, *args):
        import invariants.reference.numpy as ref

        out, weights = ref.attention(*args)
        return (out, weights) if self.with_weights else out


def test_the_shape_law_honours_attention_weights_false():
    inv = REGISTRY["shapes.attention_answer_shape"]
    assert _run(inv, Implementation(_OutOnly(False), label="out only", backend="numpy"))[0] == "passed"
    status, report = _run(inv, Implementation(_OutOnly(True), label="a tuple", backend="numpy"))
    assert status == "failed", report
    assert "number of arrays attention returned (out alone, as ATTENTION_WEIGHTS = False declares)=2, but should be 1" in report, report


def test_llama_decode_may_answer_either_cache_form_but_no_other():
    import invariants.reference.numpy as ref

    inv = REGISTRY["shapes.llama_decode_answer_shape"]

    def with_cache(cache):
        return Implementation.from_functions(backend="numpy", llama_decode=lambda *args: (ref.llama_decode(*args)[0], cache(args)))

    def chunks(args):
        return 1 if args[-1] is None else np.asarray(args[-1]).size

    assert _run(inv, with_cache(lambda args: np.full(chunks(args), 3)))[0] == "passed"  # cache_sizes (n,)
    positions = with_cache(lambda args: np.zeros((chunks(args), len(args[1]["blocks"]), 2, 5), dtype=np.int64))  # (n, L, H_kv, S)
    assert _run(inv, positions)[0] == "passed"
    status, report = _run(inv, with_cache(lambda args: np.zeros((chunks(args) + 1,), dtype=np.int64)))
    assert status == "failed" and "(cache_sizes)=none of its forms, but should be one of them" in report, report
