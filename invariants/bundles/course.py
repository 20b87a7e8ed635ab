"""What every bundle carries: the course's assignment, its secret, the project's wheel and the pins it installs with.

    course = Course.make("p01", secret_file="course.secret")   # the assignment checked, the secret read, the wheel built

The assignment is loaded through the gate (invariants.gate.config.load_assignment) when the bundle is built, so a
typo fails on the course's machine, not on the platform. The wheel is `--wheel`, else built from the checkout this
package was imported from (pip wheel, no dependencies). constraints.txt pins every package the wheel pulls in, to the
versions installed here, where the course tried its assignment: the platform installs what was tested.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tomllib

DISTRIBUTION = "transformer-invariants"
SECRET_FILE = "course-secret"  # the secret's name in every bundle that carries it (mode 0600: root's alone on the platform)
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE")  # with the packages pyproject.toml includes: what `pip wheel` needs of the checkout
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # torch's CPU build (PyPI's Linux wheel pulls in CUDA, gigabytes of it)
WHEEL_SECONDS = 300


class BundleError(Exception):
    """The bundle cannot be built as asked: the message names the fix."""


@dataclass(frozen=True)
class Course:
    """One assignment made ready to ship: its file, the loaded Assignment, the secret (or None), the wheel, and whether torch goes too."""

    assignment_file: Path
    assignment: object  # invariants.gate.config.Assignment
    secret: object  # invariants.gate.secret.CourseSecret, or None where the bundle carries none (the students' workflow)
    wheel: Path
    torch: bool

    @classmethod
    def make(cls, assignment, *, secret_file=None, secret_env=None, wheel=None, torch=None, with_secret=True, workdir):
        """Load and check the assignment, read the course secret (the gate's rule: docs/gate.md, Seeds), and find or build the wheel.

        torch: None follows the assignment (torch unless its backend is "numpy"); workdir: where a built wheel goes.
        """
        from invariants.gate.config import ConfigError, load_assignment
        from invariants.gate.secret import SecretError, course_secret

        try:
            loaded = load_assignment(assignment)
        except ConfigError as exc:
            raise BundleError(str(exc)) from None
        secret = None
        if with_secret:
            try:
                secret = course_secret(loaded, secret_file=secret_file, secret_env=secret_env)
            except (SecretError, OSError) as exc:
                raise BundleError(str(exc)) from None
            if secret is None:  # only a preview's policy gives none, and a bundle grades
                raise BundleError("no course secret: pass --secret-file PATH or --secret-env VAR")
        if wheel and not (Path(wheel).is_file() and Path(wheel).name.startswith("transformer_invariants-") and wheel.endswith(".whl")):
            raise BundleError(f"--wheel {wheel}: not a wheel of {DISTRIBUTION} (python -m build --wheel writes one into dist/)")
        return cls(Path(loaded.path), loaded, secret, Path(wheel) if wheel else build_wheel(workdir),
                   loaded.backend != "numpy" if torch is None else torch)

    @property
    def requirement(self):
        """What pip installs: the wheel, with the torch extra where the course grades torch code."""
        return self.wheel.name + ("[torch]" if self.torch else "")

    @property
    def index_options(self):
        """pip's options for the platform: torch's CPU index beside PyPI when torch goes too."""
        return f"--extra-index-url {TORCH_INDEX}" if self.torch else ""

    def constraints(self):
        """constraints.txt: every distribution the wheel pulls in, pinned to the version installed here (a local label such as +cpu dropped)."""
        lines = [f"# Pinned by invariants-bundle from the environment that built this bundle ({sys.version.split()[0]}).",
                 *(f"{name}=={version}" for name, version in sorted(dependency_pins(self.torch).items()))]
        return "\n".join(lines) + "\n"

    def python_minimum(self):
        """The oldest Python every pinned distribution supports, as (major, minor), from their Requires-Python."""
        floors = [(3, 10)]
        for name in dependency_pins(self.torch):
            needs = importlib.metadata.metadata(name).get("Requires-Python") or ""
            floors += [(int(a), int(b)) for a, b in re.findall(r">=\s*(\d+)\.(\d+)", needs)]
        return max(floors)

    def write_shared(self, folder, *, secret=True):
        """The wheel, constraints.txt, the assignment file and (secret=True) the secret, mode 0600, into folder; their names."""
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.wheel, folder / self.wheel.name)
        (folder / "constraints.txt").write_text(self.constraints())
        shutil.copy(self.assignment_file, folder / self.assignment_file.name)
        if secret:
            write_secret(folder / SECRET_FILE, self.secret.value)
        return [self.wheel.name, "constraints.txt", self.assignment_file.name, *([SECRET_FILE] if secret else [])]


def write_secret(path, value):
    """Write the secret with mode 0600 from the start (never readable by others, not even for an instant)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(value + "\n")
    os.chmod(path, 0o600)


def dependency_pins(torch):
    """{distribution: version} of everything the project's wheel installs here, its torch extra included when torch is True."""
    from packaging.requirements import Requirement

    pins, todo = {}, [(DISTRIBUTION, "torch" if torch else "")]
    while todo:
        name, extra = todo.pop()
        for text in importlib.metadata.requires(name) or ():
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
                continue
            key = canonical(requirement.name)
            if key in pins:
                continue
            try:
                pins[key] = importlib.metadata.version(requirement.name).split("+")[0]
            except importlib.metadata.PackageNotFoundError:
                raise BundleError(f"{requirement.name} (which {name} requires) is not installed here, so it cannot be pinned: "
                                  f"install it (pip install {'.[torch]' if torch else '.'} -c constraints.txt), or pass --no-torch") from None
            todo.append((requirement.name, ""))
    return pins


def canonical(name):
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def source_root():
    """The checkout this package was imported from (its pyproject.toml names the project), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    name = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {}).get("name")
    return root if name == DISTRIBUTION else None


def source_packages(root):
    """The top-level packages of the checkout that pyproject.toml's [tool.setuptools.packages.find] include names."""
    found = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]["find"]
    return sorted({pattern.split(".")[0].rstrip("*") for pattern in found["include"]} & {p.name for p in root.iterdir() if p.is_dir()})


def build_wheel(workdir):
    """The project's wheel built from the checkout (a copy of its packages, so the checkout gets no build/ or egg-info); its path."""
    root = source_root()
    if root is None:
        raise BundleError("this installation is not a checkout, so there is no wheel to build: pass --wheel PATH "
                          "(python -m build --wheel in a clone writes one into dist/)")
    staging = Path(tempfile.mkdtemp(prefix="source-", dir=workdir))
    for name in SOURCE_FILES:
        if (root / name).exists():
            shutil.copy(root / name, staging / name)
    for package in source_packages(root):
        shutil.copytree(root / package, staging / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = Path(workdir) / "wheel"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels),
                           str(staging)], capture_output=True, text=True, timeout=WHEEL_SECONDS)
    shutil.rmtree(staging, ignore_errors=True)
    built = sorted(wheels.glob("transformer_invariants-*.whl"))
    if done.returncode != 0 or not built:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BundleError(f"building the wheel failed ({last}): install setuptools>=77 here, or pass --wheel PATH")
    return built[-1]


def render(template, **fields):
    """A template of this package (templates/NAME) with each @FIELD@ replaced; every placeholder must be filled."""
    text = (Path(__file__).parent / "templates" / template).read_text(encoding="utf-8")
    for key, value in fields.items():
        text = text.replace(f"@{key}@", str(value))
    left = re.findall(r"@[A-Z_]+@", text)
    assert not left, f"{template}: {left} not filled"  # a template and its caller disagree: our bug, never the user's
    return text


# -- on the platform: the grading entry ---------------------------------------------------------------


def run_gate(submission, assignment, secret_file, reports):
    """Grade one submission with invariants-gate (its CLI, in a process of its own) into `reports`; its exit code (docs/gate.md, Exit codes).

    The gate's terminal report and progress go to this process's output, which the platforms show to staff.
    """
    command = [sys.executable, "-m", "invariants.gate", str(submission), "-a", str(assignment), "--secret-file", str(secret_file),
               "-o", str(reports)]
    return subprocess.run(command, stdin=subprocess.DEVNULL).returncode
