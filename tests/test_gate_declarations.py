"""In the gate a declaration is held to the suite's bounds and to what the assignment's [declarations] table allows."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants.gate.config import ConfigError, load_assignment
from invariants.gate.grade import grade
from invariants.gate.reports import to_markdown, to_terminal
from invariants.gate.result import EXIT_CODES, NOT_GRADABLE, PASSED

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
