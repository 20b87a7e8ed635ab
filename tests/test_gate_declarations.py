"""In the gate a declaration is read as the suite reads it, held to the suite's bounds and to what the assignment's [declarations] table allows."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from invariants.conventions import CONVENTIONS, read_declarations
from invariants.gate import worker
from invariants.gate.config import ConfigError, load_assignment
from invariants.gate.grade import grade
from invariants.gate.reports import to_markdown, to_terminal
from invariants.gate.result import EXIT_CODES, NOT_GRADABLE, PASSED
from invariants.protocol import load_implementation

FIXTURES = Path(__file__).parent / "fixtures"
DECLARING = FIXTURES / "declarations"
ROOT = Path(__file__).resolve().parent.parent
HOSTILE = (FIXTURES / "assignments" / "hostile.toml").read_text()  # two layer_norm invariants, 5 examples, short limits


def _assignment(tmp_path, table):
    path = tmp_path / "assignment.toml"
    path.write_text(table + HOSTILE)  # first: a top-level key must come before the file's tables
    return load_assignment(path)


BAD_TABLES = [
    ("[declarations]\nLAYER_NORM_ESP = [1e-5]\n",
     "[declarations] LAYER_NORM_ESP = [1e-05] is not a declarable convention; did you mean LAYER_NORM_EPS?"),
    ("[declarations]\nLAYER_NORM_EPS = [1e300]\n", "[declarations] LAYER_NORM_EPS = [1e+300] holds a value no submission may declare: "
     "LAYER_NORM_EPS = 1e+300 is not allowed: expected a float from 1e-16 to 0.001"),
    ("[declarations]\nFEED_FORWARD_RATIO = [4, 50000]\n", "FEED_FORWARD_RATIO = 50000 is not allowed: expected an int from 1 to 64"),
    ("[declarations]\nGELU_FORM = [\"exact\"]\n", "GELU_FORM = 'exact' is not allowed: expected 'tanh' or 'erf'"),
    ("[declarations]\nGELU_FORM = \"erf\"\n", "[declarations] GELU_FORM = 'erf' must be a non-empty list of the values a submission may declare"),
    ("[declarations]\nCAUSAL_ONLY = []\n", "(leave the key out to allow none)"),
    ("declarations = 3\n", "declarations = 3 must be a table ([declarations])"),
]


@pytest.mark.parametrize("table, message", BAD_TABLES, ids=range(len(BAD_TABLES)))
def test_a_bad_declarations_table_says_what_to_fix(tmp_path, table, message):
    with pytest.raises(ConfigError) as error:
        _assignment(tmp_path, table)
    assert message in str(error.value)


@pytest.mark.parametrize("name", ["p01", "lesson", "llama"])
def test_shipped_assignments_say_what_may_be_declared(name):
    assert load_assignment(ROOT / "invariants" / "gate" / "assignments" / f"{name}.toml").declarations is not None


def test_the_table_allows_its_values_and_every_default_refuses_the_rest(tmp_path):
    a = _assignment(tmp_path, "[declarations]\nLAYER_NORM_EPS = [1e-5, 1e-12]\nGELU_FORM = [\"erf\"]\n")
    assert a.refused_declaration({"LAYER_NORM_EPS": 1e-12, "GELU_FORM": "erf", "ATTENTION_WEIGHTS": True}) is None  # True: the default
    assert a.refused_declaration({"LAYER_NORM_EPS": 1e-6}) == (
        "the submission declares LAYER_NORM_EPS = 1e-06, which this assignment does not allow (it allows LAYER_NORM_EPS = 1e-05 "
        "or LAYER_NORM_EPS = 1e-12): remove the declaration or declare an allowed value")
    assert a.refused_declaration({"ATTENTION_WEIGHTS": False}) == (
        "the submission declares ATTENTION_WEIGHTS = False, which this assignment does not allow (it allows no ATTENTION_WEIGHTS "
        "declaration): remove the declaration")
    assert _assignment(tmp_path, "").refused_declaration({"ATTENTION_WEIGHTS": False}) is None  # no table: the suite's bounds


def test_an_eps_that_makes_layer_norm_its_bias_is_refused(tmp_path):
    result = grade(DECLARING / "bias_as_layer_norm.py", _assignment(tmp_path, ""))
    assert result.verdict == NOT_GRADABLE and EXIT_CODES[result.verdict] == 3
    assert result.reason == ("LAYER_NORM_EPS = 1e+300 is not allowed: expected a float from 1e-16 to 0.001; real norms use 1e-12 (BERT) "
                             "to 1e-3 (Keras), most 1e-5 (GPT-2, PyTorch) or 1e-6 (Llama, T5)")


def test_an_int_too_large_to_print_is_refused_by_its_size(tmp_path):
    result = grade(DECLARING / "huge_ratio.py", _assignment(tmp_path, ""))
    assert result.verdict == NOT_GRADABLE
    assert result.reason.startswith("FEED_FORWARD_RATIO = 'an int of 16610 bits' is not allowed: expected an int from 1 to 64")


def test_a_value_the_assignment_does_not_allow_is_not_gradable_and_an_allowed_one_is_graded(tmp_path):
    refused = grade(DECLARING / "eps_1e6.py", _assignment(tmp_path, "[declarations]\nLAYER_NORM_EPS = [1e-5]\n"))
    assert refused.verdict == NOT_GRADABLE and EXIT_CODES[refused.verdict] == 3
    assert refused.reason.startswith("the submission declares LAYER_NORM_EPS = 1e-06, which this assignment does not allow")
    assert {i.status for i in refused.invariants} == {"not_run"}
    allowed = grade(DECLARING / "eps_1e6.py", _assignment(tmp_path, "[declarations]\nLAYER_NORM_EPS = [1e-5, 1e-6]\n"))
    assert allowed.verdict == PASSED and allowed.submission["declarations"] == {"LAYER_NORM_EPS": 1e-6}
    assert "  declared: LAYER_NORM_EPS = 1e-06\n" in to_terminal(allowed)
    assert "Declared conventions: LAYER\\_NORM\\_EPS = 1e-06." in to_markdown(allowed)  # _ escaped: Markdown shows LAYER_NORM_EPS


# -- one reading of a declaration, in the suite and in the gate -----------------------------------------------------

try:
    import torch
except ImportError:  # the numpy cases still run
    torch = None

READ_ALIKE = [  # (name, the value as written, the plain value the suite and the gate both read)
    ("LAYER_NORM_EPS", np.float64(1e-5), 1e-5),
    ("LAYER_NORM_EPS", np.float32(1e-5), 1e-5),  # its shortest decimal, not float32's binary neighbour 1.0000000474974513e-05
    ("LAYER_NORM_EPS", np.array(1e-6), 1e-6),
    ("FEED_FORWARD_RATIO", np.int64(4), 4),
    ("FEED_FORWARD_RATIO", np.array(8, dtype=np.int32), 8),
    ("FEED_FORWARD_RATIO", enum.IntEnum("Ratio", {"GPT2": 4}).GPT2, 4),
    ("GELU_FORM", np.str_("erf"), "erf"),
    ("ATTENTION_BIASES", np.bool_(True), True),
] + ([("LAYER_NORM_EPS", torch.tensor(1e-5), 1e-5), ("LAYER_NORM_EPS", torch.tensor(1e-12, dtype=torch.float64), 1e-12),
       ("FEED_FORWARD_RATIO", torch.tensor(4), 4), ("ATTENTION_BIASES", torch.tensor(True), True)] if torch else [])
REFUSED_ALIKE = [  # (name, a value no convention allows, the refusal both give)
    ("LAYER_NORM_EPS", np.array([1e-5]), "LAYER_NORM_EPS = 'an array of shape (1,)' is not allowed: expected a float from 1e-16"),
    ("LAYER_NORM_EPS", np.complex128(1e-5), "LAYER_NORM_EPS = 'a complex' is not allowed: expected a float"),
    ("GELU_FORM", ["tanh"], "GELU_FORM = 'a list' is not allowed: expected 'tanh' or 'erf'"),
    ("GELU_FORM", "tanh" * 100, "GELU_FORM = 'a str of 400 characters' is not allowed: expected 'tanh' or 'erf'"),
    ("GELU_FORM", None, "GELU_FORM = None is not allowed: expected 'tanh' or 'erf'"),
    ("FEED_FORWARD_RATIO", np.uint64(2**64 - 1), "FEED_FORWARD_RATIO = 'an int of 64 bits' is not allowed: expected an int from 1 to 64"),
    ("FEED_FORWARD_RATIO", 10**5000, "FEED_FORWARD_RATIO = 'an int of 16610 bits' is not allowed: expected an int from 1 to 64"),
] + ([("LAYER_NORM_EPS", torch.tensor([1e-5]), "LAYER_NORM_EPS = 'a tensor of shape (1,)' is not allowed: expected a float")] if torch else [])


def _read_by_the_gate(namespace):
    """What the gate's parent reads: the worker's plain values (as JSON carries them), read again by the suite's reader."""
    sent = json.loads(json.dumps(worker._declarations(namespace, list(CONVENTIONS))))
    return read_declarations(SimpleNamespace(**sent))


@pytest.mark.parametrize("name, value, plain", READ_ALIKE, ids=[f"{n}={v!r}" for n, v, _ in READ_ALIKE])
def test_the_suite_and_the_gate_read_a_numpy_or_torch_scalar_as_its_plain_value(name, value, plain):
    namespace = SimpleNamespace(**{name: value})
    for read in (read_declarations(namespace), _read_by_the_gate(namespace)):
        assert read == {name: plain} and type(read[name]) is type(plain), read


@pytest.mark.parametrize("name, value, message", REFUSED_ALIKE, ids=range(len(REFUSED_ALIKE)))
def test_the_suite_and_the_gate_refuse_any_other_value_in_the_same_words(name, value, message):
    namespace = SimpleNamespace(**{name: value})
    with pytest.raises(ValueError) as by_the_suite:
        read_declarations(namespace)
    with pytest.raises(ValueError) as by_the_gate:
        _read_by_the_gate(namespace)
    assert str(by_the_suite.value) == str(by_the_gate.value) and str(by_the_suite.value).startswith(message), str(by_the_suite.value)


def test_a_correct_submission_declaring_numpy_scalars_is_graded_and_passes(tmp_path):
    """LAYER_NORM_EPS = np.float64(1e-5) and FEED_FORWARD_RATIO = np.int64(4), both allowed by P01, were "not gradable" in the gate."""
    source = (FIXTURES / "honest" / "second_student.py").read_text()
    submission = tmp_path / "numpy_scalars.py"
    submission.write_text(source + "\nLAYER_NORM_EPS = np.float64(1e-5)\nFEED_FORWARD_RATIO = np.int64(4)\n")
    p01 = dataclasses.replace(load_assignment(ROOT / "invariants" / "gate" / "assignments" / "p01.toml"), require=(), max_examples=10)
    result = grade(submission, p01, secret="test-secret")
    assert result.verdict == PASSED and result.score == result.max_score, result.reason
    assert result.submission["declarations"] == {"GELU_FORM": "tanh", "LAYER_NORM_EPS": 1e-5, "FEED_FORWARD_RATIO": 4}
    assert load_implementation(str(submission)).declarations == result.submission["declarations"]  # what pytest --impl reads
