"""`python -m invariants.accounting MODEL`: the card for a known model's name or a config.json (see invariants.accounting.cli)."""

from invariants.accounting.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
