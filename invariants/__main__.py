"""`python -m invariants`: print the invariant catalogue as Markdown (docs/catalogue.md's list is this output), or a generated table.

    python -m invariants                # the catalogue, one table per component (docs/catalogue.md)
    python -m invariants --names        # one invariant name per line
    python -m invariants --protocol 2   # docs/protocol.md's table of the functions version 2 added
    python -m invariants --conventions  # the README's table of every declarable convention
"""

from __future__ import annotations

import argparse

from invariants.conventions import CONVENTIONS
from invariants.pipes import quiet_when_reader_leaves
from invariants.protocol import FUNCTIONS, declarations
from invariants.registry import COMPONENTS, all_invariants

BEGIN, END = "<!-- catalogue: begin (python -m invariants) -->", "<!-- catalogue: end -->"
CONVENTIONS_BEGIN = "<!-- conventions: begin (python -m invariants --conventions) -->"
CONVENTIONS_END = "<!-- conventions: end -->"


def protocol_markers(version):
    """The markers around docs/protocol.md's table of the functions `version` added."""
    return f"<!-- functions v{version}: begin (python -m invariants --protocol {version}) -->", f"<!-- functions v{version}: end -->"


def catalogue_markdown():
    """The registry as Markdown: per component, each invariant's name, statement and where it applies."""
    invariants = all_invariants()
    lines = []
    for component in COMPONENTS:
        rows = [inv for inv in invariants if inv.component == component]
        lines += [f"**{component}** ({len(rows)})", "", "| invariant | property | needs |", "| --- | --- | --- |"]
        for inv in rows:
            needs = ", ".join(inv.requires)
            if inv.backends != ("numpy", "torch"):
                needs += f"; {'/'.join(inv.backends)} only"
            statement = inv.statement.replace("|", "\\|")
            lines.append(f"| `{inv.name.split('.', 1)[1]}` | {statement} | {needs} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def protocol_markdown(version):
    """docs/protocol.md's table of the protocol functions `version` added, one row per entry of invariants.protocol.FUNCTIONS,
    then the details of the entries that carry them."""
    entries = [entry for entry in FUNCTIONS.values() if entry.version == version]
    lines = ["| function | arguments | returns |", "| --- | --- | --- |"]
    lines += [f"| `{entry.signature}` | {entry.arguments} | {entry.returns} |" for entry in entries]
    lines += [part for entry in entries if entry.details for part in ("", entry.details.strip())]
    return "\n".join(lines) + "\n"


def _value(value):
    """A declarable value as Python code: "tanh", True, 10000.0."""
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def convention_values(convention):
    """What `convention` may be declared as, and its default: `"tanh"`, `"erf"` (default: undeclared), or a bounded range."""
    if convention.bounds is not None:
        (kind,), (low, high) = convention.allowed, convention.bounds
        allowed = f"{'an int' if kind is int else 'a float'} from {low:,} to {high:,}"
    else:
        allowed = ", ".join(map(_value, convention.allowed))
    return f"{allowed} (default: {'undeclared' if convention.default is None else _value(convention.default)})"


def conventions_markdown():
    """Every declarable convention of invariants.conventions.CONVENTIONS, of both protocol versions, as one Markdown table."""
    floating = {name for name, entry in FUNCTIONS.items() if entry.floating}

    def honoured_by(names):
        return "every function with floating answers" if set(names) == floating else ", ".join(f"`{n}`" for n in names)

    lines = ["| constant | values | honoured by | what it changes |", "| --- | --- | --- | --- |"]
    lines += [f"| `{d.name}` | {convention_values(CONVENTIONS[d.name])} | {honoured_by(d.honoured_by)} | {d.meaning.replace('|', chr(92) + '|')} |"
              for d in declarations()]
    return "\n".join(lines) + "\n"


@quiet_when_reader_leaves
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m invariants", description="Print the invariant catalogue.")
    parser.add_argument("--names", action="store_true", help="one invariant name per line instead of Markdown tables")
    parser.add_argument("--protocol", type=int, metavar="VERSION", help="docs/protocol.md's table of the functions VERSION added")
    parser.add_argument("--conventions", action="store_true", help="the README's table of every declarable convention")
    args = parser.parse_args(argv)
    if args.protocol is not None:
        print(protocol_markdown(args.protocol), end="")
    elif args.conventions:
        print(conventions_markdown(), end="")
    elif args.names:
        print("\n".join(inv.name for inv in all_invariants()))
    else:
        print(catalogue_markdown(), end="")


if __name__ == "__main__":
    main()
