"""Copied-code evidence: winnowing fingerprints (Schleimer, Wilkerson & Aiken 2003, the method of MOSS).

    prints = fingerprint_files(root, files)                # a submission's fingerprints, file by file
    match = compare(prints, reference_prints())            # {"score", "matches": [{file, lines, other_file, other_lines}]}

Each .py file is tokenized with Python's own tokenizer and normalised so that renaming and
reformatting change nothing: every identifier becomes one symbol, every number another, every
string a third; comments, docstrings, blank lines, line breaks and indentation are dropped;
keywords and operators stay. The hashes of every K consecutive tokens are winnowed (the
smallest hash of each window of W hashes is kept), so any shared run of at least
K + W - 1 = GUARANTEE tokens is found, and runs shorter than K are ignored as noise.

The score of A against B is the share of A's tokens covered by fingerprints that B has too:
1.0 for a copy of B, whatever was renamed or reformatted. It is asymmetric (a submission that
pastes all of the reference into a larger file scores the share of its own code that is pasted).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import keyword
import tokenize
from pathlib import Path

K = 30  # tokens per k-gram: shared runs shorter than this are noise (a two-line softmax is 34 tokens; honest solutions share such idioms)
W = 8  # k-grams per window: any shared run of K + W - 1 tokens is found
GUARANTEE = K + W - 1
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
_SOFT_KEYWORDS = set(getattr(keyword, "softkwlist", ()))


def tokens(source):
    """[(symbol, line)]: the normalised tokens of Python source (empty for source that does not tokenize)."""
    out, logical = [], []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NEWLINE or tok.type == tokenize.ENDMARKER:
                if not (logical and all(kind == tokenize.STRING for kind, _, _ in logical)):  # a docstring or bare string: dropped
                    out += [(symbol, line) for _, symbol, line in logical]
                logical = []
                continue
            if tok.type in _SKIP:
                continue
            if tok.type == tokenize.NAME:
                symbol = tok.string if keyword.iskeyword(tok.string) or tok.string in _SOFT_KEYWORDS else "v"
            elif tok.type == tokenize.NUMBER:
                symbol = "0"
            elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
                symbol = "s"
            elif tok.type in (getattr(tokenize, "FSTRING_MIDDLE", -1), getattr(tokenize, "FSTRING_END", -1)):
                continue
            else:
                symbol = tok.string
            logical.append((tok.type, symbol, tok.start[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError):
        pass
    return out


def _hash(symbols):
    return int.from_bytes(hashlib.blake2b(" ".join(symbols).encode(), digest_size=8).digest(), "big")


def fingerprints(source):
    """(selected fingerprints [(hash, token index)], every k-gram hash by position, token lines, token count)."""
    toks = tokens(source)
    symbols = [s for s, _ in toks]
    lines = [line for _, line in toks]
    grams = [_hash(symbols[i : i + K]) for i in range(len(symbols) - K + 1)]
    chosen, last = [], None
    for start in range(max(len(grams) - W + 1, 1 if grams else 0)):
        window = grams[start : start + W]
        low = min(window)
        at = start + max(i for i, h in enumerate(window) if h == low)  # the rightmost minimum
        if at != last:
            chosen.append((low, at))
            last = at
    return {"prints": chosen, "lines": lines, "count": len(symbols)}


def fingerprint_files(root, files):
    """{file: fingerprints(...)} for the .py files of a submission (paths relative to root)."""
    out = {}
    for rel in files:
        if rel.endswith(".py"):
            try:
                out[rel] = fingerprints((Path(root) / rel).read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
    return out


@functools.lru_cache(maxsize=1)
def reference_prints():
    """The reference's fingerprints ({"reference/numpy.py": ...}), from wherever the reference package is installed."""
    spec = importlib.util.find_spec("invariants.reference")  # never a student's or user's reference.py
    if spec is None or not spec.submodule_search_locations:
        return {}
    folder = Path(list(spec.submodule_search_locations)[0])
    return {f"reference/{p.name}": fingerprints(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"}


def _ranges(indices):
    """Sorted ints -> [(first, last)] runs."""
    runs = []
    for i in sorted(indices):
        if runs and i <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], i)
        else:
            runs.append([i, i])
    return [tuple(r) for r in runs]


def compare(mine, theirs, *, min_tokens=GUARANTEE):
    """How much of `mine` ({file: fingerprints}) `theirs` also has: {"score", "tokens", "matched", "matches": [...]}.

    matches: one per run of shared code, {file, lines: [first, last], other_file, other_lines: [first, last], tokens}.
    """
    where = {}  # hash -> (their file, token index), the first place they have it
    for name, fp in sorted(theirs.items()):
        for h, at in fp["prints"]:
            where.setdefault(h, (name, at))
    total = sum(fp["count"] for fp in mine.values())
    covered, matches = 0, []
    for name, fp in sorted(mine.items()):
        hits = [(at, where[h]) for h, at in fp["prints"] if h in where]
        tokens_hit = set()
        for at, _ in hits:
            tokens_hit.update(range(at, at + K))
        covered += len(tokens_hit)
        for first, last in _ranges(tokens_hit):
            if last - first + 1 < min_tokens:
                continue
            inside = [other for at, other in hits if first <= at <= last]
            other_file = max({o[0] for o in inside}, key=lambda f: sum(o[0] == f for o in inside))
            spots = [o[1] for o in inside if o[0] == other_file]
            other_lines = theirs[other_file]["lines"]
            matches.append({"file": name, "lines": [fp["lines"][first], fp["lines"][min(last, len(fp["lines"]) - 1)]],
                            "other_file": other_file,
                            "other_lines": [other_lines[min(spots)], other_lines[min(max(spots) + K - 1, len(other_lines) - 1)]],
                            "tokens": last - first + 1})
    return {"score": round(covered / total, 3) if total else 0.0, "tokens": total, "matched": covered, "matches": matches}


def describe(match, against):
    """One line for the evidence table: '83% of the code matches reference/numpy.py (layers.py:4-60 ~ reference/numpy.py:56-120, ...)'."""
    spans = ", ".join(f"{m['file']}:{m['lines'][0]}-{m['lines'][1]} ~ {m['other_file']}:{m['other_lines'][0]}-{m['other_lines'][1]}"
                      for m in match["matches"][:6])
    more = f" and {len(match['matches']) - 6} more" if len(match["matches"]) > 6 else ""
    return f"{100 * match['score']:.0f}% of the submission's code ({match['matched']} of {match['tokens']} tokens) matches {against}" + (
        f": {spans}{more}" if spans else "")


def portable(prints):
    """Fingerprints as JSON-ready data for report.json (what the merge step compares across shards)."""
    return {name: {"prints": [[h, at] for h, at in fp["prints"]], "lines": fp["lines"], "count": fp["count"]} for name, fp in prints.items()}


def from_portable(data):
    """The inverse of portable(); tolerant of reports written by hand or by older versions (returns {} then)."""
    try:
        return {str(name): {"prints": [(int(h), int(at)) for h, at in fp["prints"]], "lines": [int(x) for x in fp["lines"]],
                            "count": int(fp["count"])} for name, fp in data.items()}
    except (TypeError, ValueError, KeyError, AttributeError):
        return {}
