"""Scores that mean something: degenerate code, forbidden APIs and copied code earn nothing, and every report says why.

- A degenerate submission (zeros, a constant, the identity, NaN, random numbers, the input one ulp
  away, constants that recognise probes, constants that spend the run's clock) scores 0 on P01: the
  invariants it satisfies only vacuously are "vacuous", with the reason (invariants.gate.degenerate).
- Law-abiding garbage (a hard max, attention to the token itself, a block without attention)
  earns nothing for the laws it obeys; the honest functions beside it keep theirs.
- A law earns its points only where its functions were shown to compute in the modes it called them
  in: attention that is own-token garbage with causal=True, or gqa_attention that ignores queries and
  keys under a key mask, earns nothing for the laws of that mode and keeps the others.
- Correct code that computes in float32 is never called degenerate in a float64 run, and scores full marks where the
  assignment takes float32 rounding (P01's rounding = "float32"); nor is a decoder that reports its cache by size (only
  the parts of an answer its form fixes are compared), nor a mode whose one call is borderline (informative for some
  random moves, not others: each call is judged once).
- The check is asked among the invariants' own calls, and keeps a bounded number of bytes.
- With on_use = "fail", the invariants whose code uses a forbidden API are "voided" (results.json included).
- A renamed, reformatted copy of reference/numpy.py is flagged and, under P01, failed; two honest
  independent solutions are not flagged, against the reference or each other (invariants.gate.similarity).
- Student output that carries CI workflow commands is neutralised in every report and on the terminal.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import invariants.reference.numpy as reference
from invariants.gate import degenerate, similarity
from invariants.gate.cli import main
from invariants.gate.config import ConfigError, load_assignment
from invariants.gate.grade import grade
from invariants.gate.reports import to_terminal, write_reports
from invariants.gate.result import FAILED, PASSED
from invariants.gate.session import WorkerTransport
from invariants.strategies.decoder import LlamaConfig, init_llama_params

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
GOOD_STUDENT = ROOT / "examples" / "submissions" / "good_student"
SECOND_STUDENT = FIXTURES / "honest" / "second_student.py"
COPY = FIXTURES / "copied" / "renamed_reference.py"


@pytest.fixture(scope="module")
def p01():
    """P01 as shipped, minus the sandbox requirement (these tests are about scores, and run on hosts without bubblewrap too),
    at 20 examples per invariant instead of 60 (the figures in docs/gate.md are at 60)."""
    return dataclasses.replace(load_assignment(ROOT / "invariants" / "gate" / "assignments" / "p01.toml"), require=(), max_examples=20)


# Two variants of SECOND_STUDENT, built from its text so that its code is written once.
OWN_TOKEN_WHEN_CAUSAL = """    if causal:  # the trick: each token sees only itself (own-token attention never leaks the future)
        B, T, _ = x.shape
        return (x @ W_v) @ W_o, np.broadcast_to(np.eye(T), (B, n_heads, T, T)).copy()
"""
IN_FLOAT32 = '''

def _float32(value):
    """value with every float64 array in it (dicts and lists included) as float32."""
    if isinstance(value, dict):
        return {key: _float32(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_float32(item) for item in value)
    return value.astype(np.float32) if isinstance(value, np.ndarray) and value.dtype == np.float64 else value


def _in_float32(function):
    def call(*args, **keywords):
        return function(*_float32(args), **_float32(keywords))
    call.__name__ = function.__name__
    return call


for _name in ("softmax", "cross_entropy", "layer_norm", "gelu", "attention", "feed_forward", "transformer_block", "gpt_logits"):
    globals()[_name] = _in_float32(globals()[_name])
'''


@pytest.fixture(scope="module")
def causal_own_value(tmp_path_factory):
    """SECOND_STUDENT but for one trick: whenever causal=True its attention returns each token's own value."""
    source = SECOND_STUDENT.read_text()
    signature = "def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True):\n"
    assert source.count(signature) == 1
    path = tmp_path_factory.mktemp("causal_own_value") / "causal_own_value.py"
    path.write_text(source.replace(signature, signature + OWN_TOKEN_WHEN_CAUSAL))
    return path


@pytest.fixture(scope="module")
def float32_student(tmp_path_factory):
    """SECOND_STUDENT computing in float32, as most students' torch code does: every function casts its float arguments to
    float32 and answers in float32 (about 1e-7 relative from the float64 reference); nothing in it declares a dtype."""
    path = tmp_path_factory.mktemp("float32_casting") / "float32_casting.py"
    path.write_text(SECOND_STUDENT.read_text() + IN_FLOAT32)
    return path


def _reports(result, out):
    write_reports(result, out)
    return {name: (out / name).read_text() for name in ("report.json", "junit.xml", "results.json", "summary.md")}


def _says_why(text):
    return "held only" in text or "held for a function" in text


def _degenerate(mode, tmp_path):
    folder = tmp_path / f"degenerate_{mode}"
    shutil.copytree(HOSTILE / "degenerate", folder)
    (folder / "mode.txt").write_text(mode)
    return folder


@pytest.mark.parametrize("mode", ["zeros", "constant", "identity", "nan", "random", "one_ulp", "probe_aware"])
def test_a_degenerate_submission_scores_zero_and_every_report_says_why(mode, p01, tmp_path):
    result = grade(_degenerate(mode, tmp_path), p01)
    assert result.verdict == FAILED and result.score == 0, [(i.name, i.status) for i in result.invariants if i.score]
    vacuous = [i for i in result.invariants if i.status == "vacuous"]
    assert all(_says_why(i.reason) and "docs/gate.md" in i.reason for i in vacuous), {i.reason for i in vacuous}
    if mode != "nan":  # NaN fails every invariant outright; the others pass some of them vacuously
        assert vacuous, "a degenerate submission passes relational invariants vacuously: they must be caught"
        if mode == "one_ulp":
            assert "identity" in {v["kind"] for v in result.submission["degenerate"].values()}, result.submission["degenerate"]
        texts = _reports(result, tmp_path / "out")
        gradescope = json.loads(texts["results.json"])
        assert gradescope["score"] == 0
        shown = next(t for t in gradescope["tests"] if t["name"] == vacuous[0].name)
        assert shown["score"] == 0 and shown["status"] == "failed" and vacuous[0].reason in shown["output"]
        assert vacuous[0].reason in texts["summary.md"] and "VACUOUS" not in texts["summary.md"]  # the table shows the mark and reason
        assert any(c.find("failure") is not None and _says_why(c.find("failure").get("message"))
                   for c in ET.fromstring(texts["junit.xml"].split("\n", 1)[1]).iter("testcase"))
        assert json.loads(texts["report.json"])["submission"]["degenerate"]


def test_constants_that_spend_the_run_clock_still_score_zero(p01, tmp_path):
    short = dataclasses.replace(p01, limits=dataclasses.replace(p01.limits, call_seconds=2, run_seconds=12))
    result = grade(_degenerate("clock", tmp_path), short)
    assert any(i.status == "not_run" for i in result.invariants), "the run's clock should have run out"
    assert result.score == 0, [(i.name, i.status) for i in result.invariants if i.score]
    assert result.submission["degenerate"], "the check is made however little of the run's clock is left"


def test_law_abiding_garbage_earns_nothing_for_the_laws_it_obeys(p01):
    result = grade(HOSTILE / "lawful_garbage.py", p01)
    garbage = {"softmax", "attention", "transformer_block", "gpt_logits"}
    assert set(result.submission["degenerate"]) == garbage, result.submission["degenerate"]
    for inv in result.invariants:
        calls = set(next(s for s in p01.selected if s.name == inv.name).invariant.requires)
        if calls & garbage:
            assert inv.score == 0, (inv.name, inv.status)
        elif calls & {"cross_entropy"}:
            assert inv.status == "passed", (inv.name, inv.reason)  # the honest functions beside the garbage keep their points
    vacuous = next(i for i in result.invariants if i.name == "softmax.softmax_rows_sum_to_one")
    assert vacuous.status == "vacuous" and vacuous.reason.startswith("held for a function that does not compute softmax: softmax "
                                                                     "disagreed with the reference on "), vacuous.reason


@pytest.mark.parametrize("submission", [GOOD_STUDENT, SECOND_STUDENT], ids=["good_student", "second_student"])
def test_honest_solutions_keep_every_point(submission, p01):
    result = grade(submission, p01)
    assert result.verdict == PASSED and result.score == result.max_score, result.reason
    assert result.submission["degenerate"] == {}
    assert result.similarity["reference"]["score"] < 0.2
    assert not [e for e in result.evidence if e["kind"] == "copied_code"]


class _Worker:
    """A worker stand-in that answers honestly (the reference's answer; llama_decode's cache by its size) and lists every call it is asked."""

    def __init__(self):
        self.calls = []

    def call(self, name, args):
        self.calls.append(name)
        if name == "llama_decode":  # (logits, cache_sizes (n,)): a cache that grows by what it holds, as the protocol allows
            ids, params, n_heads, n_kv_heads, _, _, chunks = args
            per_token = 2 * len(params["blocks"]) * ids.shape[0] * n_kv_heads * (params["embed"].shape[1] // n_heads)
            return reference.llama_decode(*args)[0], per_token * np.cumsum(chunks)
        return getattr(reference, name)(*args)


def test_the_probes_are_asked_among_the_invariants_calls_and_judging_asks_nothing():
    worker = _Worker()
    transport = WorkerTransport(worker, ["softmax"], {}, seed=7, reference=reference)
    rng = np.random.default_rng(0)
    transport.log.current = "softmax.softmax_rows_sum_to_one"
    for _ in range(400):
        transport.call("softmax", (rng.normal(size=(3, 5)), -1))
    transport.log.current = None
    asked = len(worker.calls)
    mode = transport.log.mode_of("softmax", (np.zeros((3, 5)), -1))
    assert transport.log.computes("softmax", mode), "a nearby probe, asked among the invariant's calls, shows that softmax computes softmax"
    assert 400 < asked <= 400 + 1 + 2 * degenerate.PROBES and len(transport.log.probes["softmax"]) == degenerate.PROBES
    assert degenerate.judge("softmax", transport.log, {"softmax.softmax_rows_sum_to_one"}, "float64") is None
    assert len(worker.calls) == asked, "judging must not call the submission: no phase of the run is the check"


def test_a_decoder_that_reports_its_cache_by_size_computes():
    """The computation check compares the parts of an answer that its form fixes: cache sizes (n,) are as legal as positions."""
    transport, rng = WorkerTransport(_Worker(), ["llama_decode"], {}, seed=7, reference=reference), np.random.default_rng(0)
    transport.log.current = "decoding.cache_size_law"
    for seed in range(8):
        config = LlamaConfig(vocab=6, n_layers=1, n_kv_heads=1, group=2, d_head=2, d_ff=4, rope_base=10000.0, window=(None, 2)[seed % 2],
                             qkv_bias=False)
        args = (rng.integers(0, config.vocab, (1, 4)), init_llama_params(config, seed), config.n_heads, config.n_kv_heads, config.rope_base,
                config.window, np.array([2, 1, 1]))
        transport.call("llama_decode", args)
    transport.log.current = None
    # before: "llama_decode disagreed with the reference on 4 of 4 ...", its sizes compared with the reference's positions
    assert degenerate.judge("llama_decode", transport.log, {"decoding.cache_size_law"}, "float64") is None


def test_a_mode_whose_only_call_is_borderline_is_read_once():
    """An honest gqa_attention whose only call with a key mask is borderline (moving q by STEP of its size moves the answer by about
    the tolerance: informative for some draws of the move, not for others) computes: the evidence and the finding that a mode has
    no informative call read one verdict on each call."""
    rel, invariant = degenerate.agreement("float64"), "masking.masks_compose_in_low_precision"
    q = np.full((1, 1, 2, 1), 4 * rel / (degenerate.STEP / 4))  # scores of about 1.6, where w0·w1 is about 1/4
    borderline = (q, np.array([0.0, 1.0]).reshape(1, 1, 2, 1), np.array([1.0, 3.0]).reshape(1, 1, 2, 1), True, np.ones((1, 2), bool), 2)
    rng = np.random.default_rng(0)
    for seed in range(20):
        transport = WorkerTransport(_Worker(), ["gqa_attention"], {}, seed=seed, reference=reference)
        transport.log.current = invariant
        unmasked = [(*(rng.normal(size=(1, 2, 3, 4)) for _ in range(3)), True, None, None) for _ in range(12)]
        for args in [*unmasked[:6], borderline, *unmasked[6:]]:
            transport.call("gqa_attention", args)
        transport.log.current = None
        # before: one seed in four, "did not compute gqa_attention with key_mask all True": no evidence, yet informative
        assert degenerate.judge("gqa_attention", transport.log, {invariant}, "float64") is None, seed


def test_the_call_log_keeps_a_bounded_number_of_bytes():
    log = degenerate.CallLog()
    x = np.zeros((4, 8))
    for invariant in range(40):
        log.current = f"inv{invariant}"
        for _ in range(8):
            log.record("softmax", (x, -1), np.zeros(512 * 1024, dtype=bool))  # half a MiB as bool, 4 MiB as float64
            log.record("attention", (x,), np.zeros((1 << 20) + 1, dtype=bool))  # over ITEM_BYTES: not kept
    kept = sum(a.nbytes for _, items in log.samples.values() for call in items for a in degenerate._arrays(call["answer"]))
    assert kept <= 8 * degenerate.FUNCTION_BYTES, f"the log keeps {kept >> 20} MiB of answers as float64"
    assert log.total_bytes <= degenerate.TOTAL_BYTES and log.bytes.get("softmax", 0) <= degenerate.FUNCTION_BYTES, log.bytes
    assert not log.calls("attention")


def test_forbidden_apis_with_on_use_fail_zero_the_invariants_they_touch(tmp_path):
    assignment = load_assignment(FIXTURES / "assignments" / "forbidden.toml")
    result = grade(HOSTILE / "sdpa_attention.py", assignment)
    status = {i.name: (i.status, i.score) for i in result.invariants}
    assert status["attention.causal_non_leakage"] == ("voided", 0) and status["attention.agrees_with_reference"] == ("voided", 0)
    assert status["norms.layer_norm_known_values"] == ("passed", 1) and status["norms.layer_norm_affine"] == ("passed", 1)
    assert result.verdict == FAILED and result.score == 2 and "forbids" in result.reason
    texts = _reports(result, tmp_path)
    gradescope = json.loads(texts["results.json"])
    assert gradescope["score"] == 2
    assert {t["name"]: t["score"] for t in gradescope["tests"]}["attention.causal_non_leakage"] == 0
    assert json.loads(texts["report.json"])["score"] == 2
    reported = dataclasses.replace(assignment, on_forbidden="report")
    assert grade(HOSTILE / "sdpa_attention.py", reported).score == 8, "with on_use = report the evidence costs nothing"


def test_a_law_earns_nothing_where_its_function_was_not_shown_to_compute_in_the_law_s_mode(p01, causal_own_value):
    result = grade(causal_own_value, p01)  # honest, but own-token attention whenever causal=True
    found = result.submission["degenerate"]
    assert found["attention"]["modes"] == ["causal=True"] and found["transformer_block"]["modes"] == ["causal=True"], found
    status = {i.name: i for i in result.invariants}
    leak = status["attention.causal_non_leakage"]
    assert leak.status == "vacuous" and leak.reason.startswith("held for a function that does not compute attention with causal=True"), leak.reason
    assert status["block.causal_non_leakage"].status == "vacuous"
    assert status["attention.permutation_equivariance"].status == "passed", "a law of the mode it computes in keeps its points"
    assert result.score <= 33, result.score  # 41 before: the causal laws earned their points


MASK_LAWS = """
[assignment]
name = "gqa and its masks"
backend = "numpy"
dtype = "float32"

[examples]
profile = "ci"
max_examples = 20

[limits]
call_seconds = 5
invariant_seconds = 60
run_seconds = 300

[[invariants]]
select = ["gqa.*", "masking.*"]
"""


def test_a_key_mask_mode_that_does_not_compute_earns_nothing(tmp_path):
    (tmp_path / "masks.toml").write_text(MASK_LAWS)
    assignment = dataclasses.replace(load_assignment(tmp_path / "masks.toml"), require=())
    result = grade(HOSTILE / "masked_key_uniform.py", assignment)  # computes without a key mask, uniform weights with one
    modes = result.submission["degenerate"]["gqa_attention"]["modes"]
    assert modes and all("key_mask all True" in m or "key_mask partly False" in m for m in modes), modes
    status = {i.name: i.status for i in result.invariants}
    assert status["masking.padding_hidden_keys_ignored"] == "vacuous" and status["masking.fully_masked_rows"] == "vacuous", status
    assert status["masking.window_key_count"] == "passed", "a law that gives no key mask keeps its points"
    assert result.score <= 2, result.score  # 9 before


def test_the_mode_of_a_call_is_read_from_its_optional_arguments():
    optional = degenerate.optional_params(reference, "gqa_attention")
    assert optional == ("causal", "key_mask", "window")
    q = np.zeros((1, 2, 3, 4))
    mask = np.array([[True, False, True]])
    assert degenerate.mode_of("gqa_attention", (q, q, q, True, None, None), optional) == (("causal", True), ("key_mask", None), ("window", None))
    masked = degenerate.mode_of("gqa_attention", (q, q, q, np.bool_(False), mask, 2), optional)
    assert masked == (("causal", False), ("key_mask", "some"), ("window", "given"))
    assert degenerate.describe_mode(masked, [masked, (("causal", False), ("key_mask", None), ("window", "given"))]) == "key_mask partly False"
    assert degenerate.optional_params(reference, "gpt_logits") == () and degenerate.optional_params(reference, "attention") == ("causal",)


def test_correct_code_that_computes_in_float32_is_never_called_degenerate_and_scores_full_marks(p01, float32_student):
    result = grade(float32_student, p01)  # 11/53 before: 32 points "vacuous" for float32 rounding; then 44/53, held to float64's
    assert result.submission["degenerate"] == {}, result.submission["degenerate"]
    assert result.submission["rounding"] == "float32" and "COMPUTE_DTYPE" not in result.submission["declarations"]  # P01: rounding = "float32"
    assert result.score == result.max_score, [(i.name, i.status, i.reason[:80]) for i in result.invariants if i.status != "passed"]
    # a course that asks float64 rounding (rounding = "float64") takes the points of the laws held to it, and only those
    strict = grade(float32_student, dataclasses.replace(p01, rounding="float64"))
    assert strict.submission["rounding"] == "float64" and strict.score < strict.max_score
    assert not [i.name for i in strict.invariants if i.status == "vacuous"]
    assert all(i.status == "passed" or i.status == "failed" and "(float64)" in i.reason for i in strict.invariants), \
        [(i.name, i.status, i.reason[:80]) for i in strict.invariants if i.status != "passed"]


@pytest.mark.parametrize("dtype, rounding, ok", [("float64", "float32", True), ("float64", "float16", False), ("float32", "float64", False)])
def test_an_assignment_takes_float32_rounding_in_float64_only(dtype, rounding, ok, tmp_path):
    path = tmp_path / "course.toml"
    path.write_text(f'[assignment]\ndtype = "{dtype}"\nrounding = "{rounding}"\n[[invariants]]\nselect = "softmax.*"\n')
    if not ok:
        with pytest.raises(ConfigError, match=f"rounding = '{rounding}' must be one of"):
            load_assignment(path)
        return
    assert load_assignment(path).graded_under({"GELU_FORM": "tanh"}) == {"COMPUTE_DTYPE": "float32", "GELU_FORM": "tanh"}


def _prints(path):
    path = Path(path)
    if path.is_dir():
        return similarity.fingerprint_files(path, [p.name for p in path.glob("*.py")])
    return similarity.fingerprint_files(path.parent, [path.name])


def test_a_renamed_reformatted_copy_of_the_reference_is_flagged_and_failed(p01, tmp_path):
    copy = similarity.compare(_prints(COPY), similarity.reference_prints())
    assert copy["score"] >= 0.8 and "reference/numpy.py" in {m["other_file"] for m in copy["matches"]}
    result = grade(COPY, p01)
    assert result.verdict == FAILED and result.score == 0, result.reason
    assert result.reason.startswith(f"{100 * copy['score']:.0f}% of the submission's code matches the reference")
    assert all(i.status == "voided" for i in result.invariants)
    evidence = [e for e in result.evidence if e["kind"] == "copied_code"]
    assert evidence and "reference/numpy.py" in evidence[0]["detail"]
    texts = _reports(result, tmp_path)
    assert json.loads(texts["results.json"])["score"] == 0 and "copied code" in texts["results.json"]


def test_honest_solutions_are_not_alike():
    honest = [_prints(GOOD_STUDENT), _prints(SECOND_STUDENT), _prints(HOSTILE / "good.py")]
    for prints in honest:
        assert similarity.compare(prints, similarity.reference_prints())["score"] < 0.2
    assert similarity.compare(honest[0], honest[1])["score"] < 0.1 and similarity.compare(honest[1], honest[0])["score"] < 0.1


def test_renaming_and_reformatting_change_no_token():
    original = ("def f(x, axis=-1):\n    '''Doc.'''\n    e = np.exp(x - x.max(axis=axis, keepdims=True))  # c\n"
                "    return e / e.sum(axis=axis, keepdims=True)\n")
    renamed = ("def softmax_mine(values,\n                 ax=-1):\n    exps = np.exp(values - values.max(axis=ax,\n        keepdims=True))\n\n"
               "    return exps / exps.sum(axis=ax, keepdims=True)\n")
    assert [t for t, _ in similarity.tokens(original)] == [t for t, _ in similarity.tokens(renamed)]


COMMAND_LINE = re.compile(r"^[^\S\n]*(::|section_start:|section_end:)", re.M)
COMMAND_ANYWHERE = re.compile(r"##(vso)?\[", re.I)


def _commands_in(text):
    return COMMAND_LINE.findall(text) + COMMAND_ANYWHERE.findall(text)


def _strings(value):
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_ci_workflow_commands_are_neutralised_everywhere(tmp_path, capsys):
    assignment = FIXTURES / "assignments" / "hostile.toml"
    code = main([str(HOSTILE / "ci_commands.py"), "-a", str(assignment), "-o", str(tmp_path)])
    assert code == 1
    terminal = capsys.readouterr().out
    assert "add-mask" in terminal, "the terminal shows the failure with the student's message, neutralised"
    for name in ("report.json", "junit.xml", "results.json", "summary.md"):
        text = (tmp_path / name).read_text()
        assert "add-mask" in text, f"{name} should still show the student's words, neutralised"
        assert not _commands_in(text), (name, _commands_in(text)[:3])
        if name.endswith(".json"):  # the values, as `jq -r` would print them
            assert not [s for s in _strings(json.loads(text)) if _commands_in(s)], name
    assert not _commands_in(terminal), _commands_in(terminal)[:3]
    result = grade(HOSTILE / "ci_commands.py", load_assignment(assignment))
    assert not _commands_in(to_terminal(result, show_hidden=True))
    assert "\\::set-output" in result.output["stdout"] and "#\\#vso[" in result.output["stdout"]
