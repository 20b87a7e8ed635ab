"""`python -m invariants`: print the invariant catalogue as Markdown (the README's list is this output).

    python -m invariants            # the catalogue, one table per component
    python -m invariants --names    # one invariant name per line
"""

from __future__ import annotations

import argparse

from invariants.registry import COMPONENTS, all_invariants

BEGIN, END = "<!-- catalogue: begin (python -m invariants) -->", "<!-- catalogue: end -->"


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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m invariants", description="Print the invariant catalogue.")
    parser.add_argument("--names", action="store_true", help="one invariant name per line instead of Markdown tables")
    args = parser.parse_args(argv)
    if args.names:
        print("\n".join(inv.name for inv in all_invariants()))
    else:
        print(catalogue_markdown(), end="")


if __name__ == "__main__":
    main()
