"""A source scan of the submission: imports of the course's own packages and uses of forbidden APIs.

Evidence for review, not a proof: the scan resolves import aliases (`import torch.nn as nn`,
`from torch.nn import functional as F`) and attribute chains, and flags string constants that
name a forbidden API or a blocked package (getattr and importlib tricks). Code built at run
time (exec, base64) escapes it; the worker's runtime record catches what actually ran.
"""

from __future__ import annotations

import ast
import fnmatch

from invariants.graphs import reachable_from


def _dotted(node, aliases):
    """'torch.nn.functional.scaled_dot_product_attention' for an attribute chain on an imported name, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def _matches(name, patterns):
    return [p for p in patterns if fnmatch.fnmatchcase(name, p)]


def scan_source(text, filename, *, forbidden, blocked, own_modules=(), shipped=()):
    """Evidence items ({kind, name, where, detail, source}) found in one file's source text (`shipped`: modules it may import)."""
    try:
        tree = ast.parse(text, filename=filename)
    except (SyntaxError, ValueError):
        return []  # the worker reports the syntax error with its line
    found = []
    aliases = {}  # local name -> dotted module or attribute path

    def add(kind, name, node, detail):
        item = {"kind": kind, "name": name, "where": f"{filename}:{getattr(node, 'lineno', '?')}", "detail": detail, "source": "source scan"}
        if item not in found:
            found.append(item)

    def blocked_module(module):
        top = module.split(".")[0]
        return top in blocked and top not in own_modules and module not in shipped

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if blocked_module(alias.name):
                    add("blocked_import", alias.name, node, "import of the course's own code")
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            package = any(name.startswith(f"{node.module}.") for name in shipped)  # a shipped module's names are its own
            names = [node.module] if node.module not in shipped else [] if not package else [
                f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" not in shipped]
            for name in names:  # from invariants.adapters import toolkit is the shipped module; from invariants.adapters import gpt2 is not
                if blocked_module(name):
                    add("blocked_import", name, node, "import of the course's own code")
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                aliases[alias.asname or alias.name] = full
                for _ in _matches(full, forbidden):
                    add("forbidden_api", full, node, "imported")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = node.id if isinstance(node, ast.Name) and node.id in aliases else None
            name = aliases[name] if name else _dotted(node, aliases) if isinstance(node, ast.Attribute) else None
            if name and _matches(name, forbidden):
                add("forbidden_api", name, node, "used")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            value = node.value
            for pattern in forbidden:
                last = pattern.rsplit(".", 1)[-1]
                if fnmatch.fnmatchcase(value, last) or fnmatch.fnmatchcase(value, pattern):
                    add("forbidden_api", value, node, "named in a string (getattr or import by name?)")
        if isinstance(node, ast.Call):
            func = node.func
            callee = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if callee in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                node.args[0]._gate_call = node
    # a second pass for the import-by-name strings, now that calls marked their arguments
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and getattr(node, "_gate_call", None) is not None and isinstance(node.value, str):
            if blocked_module(node.value):
                add("blocked_import", node.value, node, "imported by name")
    return sorted(found, key=lambda item: int(item["where"].rsplit(":", 1)[1]) if item["where"].rsplit(":", 1)[1].isdigit() else 0)


def scan_files(root, files, *, forbidden, blocked, shipped=()):
    """Scan every .py file of a submission (paths relative to root)."""
    own = {f.split("/")[1].removesuffix(".py") for f in files if f.count("/") >= 1} | {f.split("/")[0].removesuffix(".py") for f in files}
    found = []
    for rel in files:
        if rel.endswith(".py"):
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
            found += scan_source(text, rel, forbidden=forbidden, blocked=blocked, own_modules=own, shipped=shipped)
    return found


# -- which protocol functions a line of the submission belongs to ---------------------------------


def _names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


class Reach:
    """Which protocol functions reach a line of the submission, by name: its own def, or a def its code names, transitively.

    An approximation (names, not a call graph): a helper is charged to every protocol function
    that mentions its name, a class to every one that names the class, a method to every one that
    names the method. Code at module level, and code no protocol function names, reaches None: all of them.
    """

    def __init__(self, root, files, protocol):
        self.defs = []  # (file, first line, last line, name)
        refs = {}  # name -> names its body (or the value assigned to it) mentions
        for rel in files:
            if not rel.endswith(".py"):
                continue
            try:
                tree = ast.parse((root / rel).read_text(encoding="utf-8", errors="replace"))
            except (SyntaxError, ValueError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.defs.append((rel, node.lineno, getattr(node, "end_lineno", node.lineno), node.name))
                    refs.setdefault(node.name, set()).update(_names_in(node) - {node.name})
            tops = list(tree.body) + [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body]
            for node in tops:  # attention = staticmethod(layers.attention), at module level or in a class (not locals)
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            refs.setdefault(target.id, set()).update(_names_in(node.value))
        def defined_refs(name):
            return [n for n in refs.get(name, ()) if n in refs]

        self.reach = {name: reachable_from([name], defined_refs) for name in protocol}  # protocol function -> the defs it reaches

    def functions(self, where):
        """The protocol functions reaching 'file.py:12', or None (module level, unknown, or reached by none)."""
        file, _, line = str(where).rpartition(":")
        if not line.isdigit():
            return None
        inside = sorted((d for d in self.defs if d[0] == file and d[1] <= int(line) <= d[2]), key=lambda d: -d[1])
        for _, _, _, name in inside:  # innermost first; a method no one names (__call__, forward) belongs to its class
            found = {protocol for protocol, seen in self.reach.items() if name in seen}
            if found:
                return found
        return None
