"""A correct student never loses a point: honest submissions in the styles students write score full marks on every shipped assignment.

The styles (tests/fixtures/honest/, each written independently of reference/):

- numpy_float64: numpy_package/, a package whose modules import each other relatively (`from .attention import ...`),
  computing in precision.DTYPE = np.float64;
- numpy_float32: the same package with DTYPE = np.float32, as a student who trains faster writes it (float32 inside
  and float32 answers);
- package_zip: numpy_package/ zipped, as a student uploads it;
- torch_float32: torch_float32/, nn.Modules with torch's default float32 parameters behind an adapter.py that loads
  the given weights into them (sibling imports, `from model import ...`).

Each is graded on each shipped assignment as it ships, but for fewer examples per invariant (EXAMPLES: the time), and
with a fixed course secret passed to grade(). A failure names every invariant that lost points, its status and why.
"""

from __future__ import annotations

import dataclasses
import shutil
import zipfile
from pathlib import Path

import pytest

from invariants.gate import confine
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.result import PASSED

ROOT = Path(__file__).resolve().parent.parent
HONEST = Path(__file__).parent / "fixtures" / "honest"
ASSIGNMENTS = ("p01", "lesson", "llama")
STYLES = ("numpy_float64", "numpy_float32", "package_zip", "torch_float32")
SECRET = "the honest set's course secret"  # a per-submission seed, as a course's CI draws them
EXAMPLES = 15  # per invariant (60 as shipped): every law still sees both modes, every function, every declaration's draws
SIMILAR_BELOW = 0.2  # the share of code matching reference/: independent work stays well under the assignments' flag (0.4)


def submission(style, folder):
    """The submission of `style`, built in `folder` where it is not a fixture as it stands."""
    package = HONEST / "numpy_package"
    if style == "numpy_float64":
        return package
    if style == "torch_float32":
        return HONEST / "torch_float32"
    if style == "package_zip":
        archive = folder / "numpy_package.zip"
        with zipfile.ZipFile(archive, "w") as zipped:
            for path in sorted(package.rglob("*.py")):
                zipped.write(path, Path("numpy_package") / path.relative_to(package))
        return archive
    copy = folder / "numpy_package"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    precision = copy / "precision.py"
    source = precision.read_text()
    assert "DTYPE = np.float64\n" in source, "numpy_package/precision.py sets DTYPE = np.float64"
    precision.write_text(source.replace("DTYPE = np.float64\n", "DTYPE = np.float32\n"))
    return copy


def lost_points(result):
    """One line per invariant that scored below its points: name, score, status and reason."""
    return "\n".join(f"  {inv.name}: {inv.score:g}/{inv.max_score:g} {inv.status}: {inv.reason}"
                     for inv in result.invariants if inv.score != inv.max_score)


@pytest.fixture(scope="module", autouse=True)
def sandbox():
    """The shipped assignments require a confined worker: hosts without bubblewrap or root's unshare(2) skip, saying why."""
    tool = confine.choose()
    if not tool.confined:
        pytest.skip(f"the shipped assignments require a sandbox and this host has none: {tool.detail}")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
@pytest.mark.parametrize("style", STYLES)
def test_an_honest_submission_scores_full_marks(style, assignment, tmp_path):
    shipped = load_assignment(ROOT / "invariants" / "gate" / "assignments" / f"{assignment}.toml")
    result = grade(submission(style, tmp_path), dataclasses.replace(shipped, max_examples=EXAMPLES), secret=SECRET)
    assert result.verdict == PASSED and result.score == result.max_score, (
        f"{style} on {assignment}: {result.verdict}, {result.score}/{result.max_score} ({result.reason})\n{lost_points(result)}")
    assert result.submission["degenerate"] == {}
    assert result.similarity["reference"]["score"] < SIMILAR_BELOW, result.similarity
