"""invariants-card: the parameters, memory and compute of a model, read from its config.json before any download.

    invariants-card llama-3-8b                        # a shipped config (invariants-card --list names them)
    invariants-card path/to/config.json --json        # or a folder holding one (a model snapshot)
    invariants-card gpt2 --set tie_word_embeddings=false --tokens 2e10

Exit codes: 0 the card was printed, 2 the input cannot be counted (one line on stderr naming the
key and what it expected) or the command line is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys

from invariants.accounting.card import card, format_card
from invariants.accounting.config import ConfigError, known_models
from invariants.pipes import quiet_when_reader_leaves

PROG = "invariants-card"


def _tokens(text):
    """A token count: an integer, or a float with an integral value (2e10)."""
    try:
        value = float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens such as 300000000000 or 3e11, got {text!r}") from None
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a whole, non-negative number of tokens, got {text!r}")
    return int(value)


def _override(text):
    """KEY=VALUE, the value read as JSON (false, 8, null, "gelu") or else kept as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (for example tie_word_embeddings=false), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Print a model's parameters (total, active per token, non-embedding, by part), weight memory, "
                    "2N and 6ND compute and KV-cache bytes per token, from its config.json.",
        epilog="Exit codes: 0 printed, 2 the config cannot be counted or a usage error. See docs/accounting.md.",
    )
    p.add_argument("model", nargs="?", help="a shipped model's name (see --list), a config.json, or a folder holding one")
    p.add_argument("--json", action="store_true", help="print the card as JSON instead of a table")
    p.add_argument("--tokens", type=_tokens, metavar="D", help="a training set's size in tokens, for 6·N·D")
    p.add_argument("--set", type=_override, action="append", default=[], metavar="KEY=VALUE",
                   help="replace a config key before counting (repeatable), e.g. --set tie_word_embeddings=false")
    p.add_argument("--list", action="store_true", help="list the shipped models' names and exit")
    return p


@quiet_when_reader_leaves
def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(known_models()))
        return 0
    if args.model is None:
        parser.error("name a model (see --list) or a config.json")
    try:
        data = card(args.model, overrides=dict(args.set), tokens=args.tokens)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=2) if args.json else format_card(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
