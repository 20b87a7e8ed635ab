"""`python -m accounting MODEL`: the card for a known model's name or a config.json (see accounting.cli)."""

from accounting.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
