"""The package's metadata: one version, the type hints' markers, the data a wheel must carry (tox -e wheel builds and uses it)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import tomllib

import invariants
from invariants.gate.config import SHIPPED_ASSIGNMENTS, shipped_assignments

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_and_the_changelog_has_it():
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "invariants.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+)?", invariants.__version__)
    assert importlib.metadata.version("transformer-invariants") == invariants.__version__, "reinstall: the metadata is stale"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{invariants.__version__}] - " in changelog and "## [Unreleased]" in changelog


def test_type_checkers_see_every_lazy_name_of_the_top_level():
    """invariants/__init__.py imports its names on first use; its TYPE_CHECKING block must name the same ones."""
    tree = ast.parse((ROOT / "invariants" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen = {(node.module, alias.name) for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    lazy = {(module, name) for module, names in invariants._EXPORTS.items() for name in names}
    assert seen == lazy


def test_the_wheel_carries_the_markers_and_the_data():
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    top_level = [pattern.rstrip("*") for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert top_level == ["invariants", "strategies", "reference"]
    for package in top_level:  # every top-level package the wheel installs is typed (PEP 561)
        assert "py.typed" in data.get(package, ()) and (ROOT / package / "py.typed").is_file(), package
    assert any("assignments/*.toml" in globs for globs in data.values())
    assert shipped_assignments() == sorted(p.stem for p in SHIPPED_ASSIGNMENTS.glob("*.toml")) and "p01" in shipped_assignments()
