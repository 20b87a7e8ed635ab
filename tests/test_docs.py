"""The generated pages stay in sync with the code: the catalogue (docs/catalogue.md), the README's conventions, the protocol tables."""

import configparser
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from invariants.__main__ import (
    BEGIN,
    CONVENTIONS_BEGIN,
    CONVENTIONS_END,
    END,
    catalogue_markdown,
    conventions_markdown,
    protocol_markdown,
    protocol_markers,
)
from invariants.asserts import InvariantViolation
from invariants.conventions import CONVENTIONS
from invariants.protocol import FUNCTIONS
from invariants.registry import COMPONENTS, REGISTRY, all_invariants

ROOT = Path(__file__).resolve().parent.parent


def _between(path, begin, end):
    """The text of the file at `path` between the markers `begin` and `end`, each of which it holds once."""
    text = (ROOT / path).read_text(encoding="utf-8")
    assert text.count(begin) == text.count(end) == 1, f"{path} needs one {begin} and one {end}"
    return text.split(begin)[1].split(end)[0].strip()


def test_the_catalogue_page_lists_exactly_the_registered_invariants():
    listed = _between("docs/catalogue.md", BEGIN, END)
    assert listed == catalogue_markdown().strip(), "docs/catalogue.md is out of date: paste the output of `python -m invariants`"
    assert len(re.findall(r"^\| `\w+` \|", listed, flags=re.M)) == len(all_invariants()) > 200


def test_the_readme_links_the_catalogue_and_no_longer_holds_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert BEGIN not in readme and "(docs/catalogue.md)" in readme


def test_the_readme_lists_every_declarable_convention_of_both_protocol_versions():
    """The README's conventions table is `python -m invariants --conventions`: one row per entry of invariants.conventions.CONVENTIONS."""
    listed = _between("README.md", CONVENTIONS_BEGIN, CONVENTIONS_END)
    assert listed == conventions_markdown().strip(), "README is out of date: paste `python -m invariants --conventions`"
    rows = re.findall(r"^\| `(\w+)` \|", listed, flags=re.M)
    assert rows == list(CONVENTIONS) and {"ROPE_THETA", "SLIDING_WINDOW", "COMPUTE_DTYPE", "GELU_FORM"} <= set(rows)


def test_every_component_has_invariants_with_a_statement_and_a_hint():
    invariants = all_invariants()
    assert {inv.component for inv in invariants} == set(COMPONENTS)
    for inv in invariants:
        assert inv.statement.endswith(".") and len(inv.hint) > 20, inv.name
        assert set(inv.requires) <= set(FUNCTIONS), inv.name


def test_protocol_document_names_every_function():
    documented = set(re.findall(r"`(\w+)\(", (ROOT / "docs" / "protocol.md").read_text()))
    assert set(FUNCTIONS) <= documented, sorted(set(FUNCTIONS) - documented)


@pytest.mark.parametrize("version", [1, 2])
def test_protocol_tables_are_generated_from_the_entries(version):
    """docs/protocol.md's table of each version is `python -m invariants --protocol N`: a row per entry of that version, then their details."""
    begin, end = protocol_markers(version)
    listed = (ROOT / "docs" / "protocol.md").read_text().split(begin)[1].split(end)[0].strip()
    assert listed == protocol_markdown(version).strip(), f"docs/protocol.md is out of date: paste `python -m invariants --protocol {version}`"
    rows = [line for line in listed.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(entry.version == version for entry in FUNCTIONS.values()) > 0


def test_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("python -m pip install tox && tox -e lint,typing,tests", "tox -e wheel"):
        assert command in readme and command in ci, command


def test_the_default_matrix_never_reports_cuda_it_did_not_run():
    """`tox` runs what every machine can run; torch-cuda is asked for (tox -m matrix) and fails where no GPU is present."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    default = [name.strip() for name in tox["tox"]["envlist"].split(",")]
    matrix = dict(line.split("=", 1) for line in tox["tox"]["labels"].strip().splitlines())["matrix "].split(",")
    assert default == ["numpy", "torch-cpu"] and [name.strip() for name in matrix] == ["numpy", "torch-cpu", "torch-cuda"]
    check = shlex.split(tox["testenv:torch-cuda"]["commands_pre"].strip())
    assert check[:2] == ["python", "-c"]
    torch = pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", check[2]], capture_output=True, text=True, timeout=120)
    if torch.cuda.is_available():
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode != 0 and "no CUDA device here" in done.stderr, (done.returncode, done.stderr)


def _readme_example(attention):
    """The README's own-test example with `attention` in place of my_model's, as its test function."""
    readme = (ROOT / "README.md").read_text()
    example = readme.split("## Use the strategies and checks in your own tests")[1].split("```python")[1].split("```")[0]
    namespace = {}
    exec(compile(example.replace("from my_model import attention", attention), "README example", "exec"), namespace)
    return namespace["test_my_attention_does_not_leak"]


LEAKY_ATTENTION = ("import reference.torch as R\n"
                   "def attention(x, W_q, W_k, W_v, W_o, n_heads, causal):\n"
                   "    return R.attention(x, W_q, W_k, W_v, W_o, n_heads, False)  # ignores the mask")


def test_readme_example_runs_and_catches_a_leak():
    _readme_example("from reference.torch import attention")()
    with pytest.raises(InvariantViolation, match="should be exactly equal"):
        _readme_example(LEAKY_ATTENTION)()


def test_a_check_called_from_ones_own_test_raises_with_the_full_report():
    """The README promises the full report: the invariant's name and statement, the shrunk example, the problem and the hint."""
    with pytest.raises(InvariantViolation) as failure:
        _readme_example(LEAKY_ATTENTION)()
    inv = REGISTRY["attention.causal_non_leakage"]
    report = "\n".join(getattr(failure.value, "__notes__", ()))
    assert f"{inv.name}: {inv.statement}" in report and f"hint: {inv.hint}" in report, report
    assert "example (shrunk):\n  inputs: {x: float32 (" in report and str(failure.value).splitlines()[0] in report, report


def test_the_readme_names_every_dtype_the_default_tox_environments_run():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    said = " ".join((ROOT / "README.md").read_text().split()).split("`tox` runs two environments: ")[1].split("`tox -m matrix`")[0]
    for env in (name.strip() for name in tox["tox"]["envlist"].split(",")):
        dtypes = set(re.findall(r"--impl-dtype (\w+)", tox[f"testenv:{env}"]["commands"]))
        described = said.split(f"`{env}` (")[1].split(")")[0]
        assert dtypes and all(dtype in described for dtype in dtypes), (env, sorted(dtypes), described)
