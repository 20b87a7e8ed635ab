"""The import structure as a map: no circle among the project's modules, and no import from a layer to a higher one.

Read from the source alone (ast: nothing is imported), counting every import wherever it stands: at the top, inside a
function, under TYPE_CHECKING, and importlib.import_module of a name the code spells out (a literal, or an f-string whose
fixed head names a package: f"invariants.laws.{component}" reaches every module of invariants.laws). LAYERS below is the
one place the layers are declared, lowest first; a package's rooms (ROOMS) are ordered the same way inside it.

    python -m pytest tests/test_structure.py      # rerun after any move; the failure names each import, file:line
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("invariants", "strategies", "reference")

# Lowest first. A module may import its own layer or a lower one. Each entry is a module, or a package with all it
# holds; a module is placed by its longest entry.
LAYERS = (
    ("leaves", ("invariants.answers", "invariants.boundary", "invariants.graphs", "invariants.pipes", "invariants.hypothesis_internals",
                "invariants.examples_db", "invariants.profiles", "invariants.reference", "reference")),
    ("framework", ("invariants", "invariants.asserts", "invariants.conventions", "invariants.tolerance", "invariants.protocol",
                   "invariants.runner", "invariants.registry", "invariants.inputs", "invariants.diagnosis", "invariants.repro",
                   "invariants.plugin")),
    ("strategies", ("invariants.strategies", "strategies")),
    ("catalogue", ("invariants.laws",)),
    ("tools", ("invariants.gate", "invariants.bundles", "invariants.adapters", "invariants.mutants", "invariants.accounting",
               "invariants.htmlreport", "invariants.fuzz", "invariants.test_invariants", "invariants.__main__")),
)

# Inside one package of the tools, its rooms, lowest first, on the same rule: the gate's worker side knows nothing of
# the parent, the session nothing of the grading, the grading nothing of batches and the command line.
ROOMS = {
    "invariants.gate": (
        ("text and the result model", ("invariants.gate.text", "invariants.gate.result")),
        ("the worker's side", ("invariants.gate.wire", "invariants.gate.seccomp", "invariants.gate.landlock", "invariants.gate.worker",
                               "invariants.gate.launch")),
        ("what the parent reads of code and answers", ("invariants.gate.frames", "invariants.gate.submission", "invariants.gate.secret",
                                                       "invariants.gate.scan", "invariants.gate.similarity", "invariants.gate.degenerate",
                                                       "invariants.gate.bitwise")),
        ("the sandbox", ("invariants.gate.confine", "invariants.gate.sandbox")),
        ("the assignment and the job", ("invariants.gate.config", "invariants.gate.job")),
        ("the session", ("invariants.gate.session",)),
        ("the grading stages", ("invariants.gate.stages",)),
        ("one grading", ("invariants.gate.grade",)),
        ("reports", ("invariants.gate.reports",)),
        ("batches and the command", ("invariants.gate.batch", "invariants.gate.cli", "invariants.gate.__main__", "invariants.gate")),
    ),
}

# Imports that break the rules above, each in a file the gate's change left to others, with why it stands today. An
# entry that no longer closes a circle or goes up a layer fails the check: delete it then.
KNOWN = {
    ("invariants.registry", "invariants.laws"): "the framework loads the catalogue by name (registry.all_invariants imports "
                                                "invariants.laws.<component>): a law module's import of the registry closes a circle",
    ("invariants.inputs", "invariants.laws"): "the input builders are registered by importing their law module (entry's inputs.py)",
    ("invariants.mutants", "invariants.mutants"): "mutants/__init__.py both holds the Mutant model its zoos import and loads each zoo "
                                                  "module it finds by name (all_mutants: no list to edit)",
    ("invariants.strategies", "invariants.strategies"): "strategies/__init__.py loads each component module it finds by name, to export "
                                                        "its __all__ (no list to edit); its __main__ reads those exports back to write the "
                                                        "typing stub",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    where: str  # path:line

    def __str__(self):
        return f"{self.importer} -> {self.imported} ({self.where})"


def modules(root=ROOT, packages=PACKAGES):
    """{dotted module name: its file} for every .py file of the packages (a package by its __init__.py)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _named(node):
    """The module names an import_module call spells out: a literal, or an f-string's fixed head ending in a dot (a package's prefix)."""
    if not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        head = arg.values[0].value
        if head.endswith(".") and head.count(".") >= 2:  # "invariants.laws.": the package is named; "invariants.": too vague to say
            return head[:-1] + ".*"
    return None


def imports(root=ROOT, packages=PACKAGES):
    """Every import between the packages' modules, wherever it stands in a file (a parent package's implicit import is not one)."""
    found = modules(root, packages)

    def targets(name):
        if name.endswith(".*"):
            prefix = name[:-2]
            return [m for m in found if m == prefix or m.startswith(prefix + ".")]
        while name and name not in found:
            name = name.rpartition(".")[0]
        return [name] if name else []

    edges = []
    for module, path in found.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in found else base for alias in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module":
                names = [n for n in [_named(node)] if n]
            for name in names:
                if name.split(".")[0] in packages:
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    edges += [Import(module, target, where) for target in targets(name) if target != module]
    return list(dict.fromkeys(edges))


def placed(module, table):
    """The index of the entry in `table` (lowest first) that holds module by its longest name, or None."""
    best = None
    for index, (_, names) in enumerate(table):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > best[1]):
                best = (index, len(name))
    return None if best is None else best[0]


def _known(edge, known):
    return any(edge.importer == a and (edge.imported == b or edge.imported.startswith(b + ".")) for a, b in known)


def circles(edges):
    """The import circles (strongly connected sets of two modules or more), each sorted, with the imports that tie each."""
    graph = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(start):  # Tarjan's algorithm, iterative
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.add(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(members)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(sorted(members), [e for e in edges if e.importer in members and e.imported in members]) for members in found]


def upward(edges, table):
    """The imports from a place in `table` to a higher one."""
    return [e for e in edges if None not in (placed(e.importer, table), placed(e.imported, table))
            and placed(e.importer, table) < placed(e.imported, table)]


@pytest.fixture(scope="module")
def edges():
    return imports()


def test_every_module_has_its_layer_and_room():
    """A module the layers do not place would escape the check: each one is placed, and each module of a package with rooms has its room."""
    found = modules()
    assert [m for m in found if placed(m, LAYERS) is None] == []
    for package, rooms in ROOMS.items():
        assert [m for m in found if m.startswith(package + ".") and placed(m, rooms) is None] == [], package


def test_no_import_circle(edges):
    """No module reaches itself through imports, counting those inside functions."""
    found = circles([e for e in edges if not _known(e, KNOWN)])
    assert not found, "\n".join(f"circle of {', '.join(members)}:\n  " + "\n  ".join(map(str, ties)) for members, ties in found)


def test_no_import_reaches_a_higher_layer(edges):
    """Each import goes to the importer's own layer or a lower one, and inside a package with rooms to its own room or a lower one."""
    rest = [e for e in edges if not _known(e, KNOWN)]
    up = upward(rest, LAYERS) + [e for package, rooms in ROOMS.items()
                                 for e in upward([e for e in rest if e.importer.startswith(package) and e.imported.startswith(package)], rooms)]
    assert not up, "imports up a layer or room:\n  " + "\n  ".join(map(str, up))


def test_each_known_exception_is_still_needed(edges):
    """An exception whose import no longer closes a circle or goes up a layer is deleted, so that it cannot come back unseen."""
    stale = []
    for pair in KNOWN:
        rest = [e for e in edges if not _known(e, {p: "" for p in KNOWN if p != pair})]
        excused = [e for e in rest if _known(e, {pair: ""})]
        tied = {e for _, ties in circles(rest) for e in ties}
        if not upward(excused, LAYERS) and not tied.intersection(excused):
            stale.append(pair)
    assert stale == [], "no longer needed: delete these from KNOWN"


def test_the_check_sees_a_circle_closed_inside_a_function(tmp_path):
    """The check itself: a circle whose second import hides in a function body, and an import up a layer, are both found."""
    package = tmp_path / "invariants"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def later():\n    from invariants.high import x\n")
    (package / "high.py").write_text("from invariants import low\nx = 1\n")
    found = imports(tmp_path, ("invariants",))
    assert [members for members, _ in circles(found)] == [["invariants.high", "invariants.low"]]
    table = (("low", ("invariants.low",)), ("high", ("invariants.high",)))
    assert [str(e) for e in upward(found, table)] == ["invariants.low -> invariants.high (invariants/low.py:2)"]
