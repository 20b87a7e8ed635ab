"""The figures' data (exact), the failure-text split, the plugin's --invariants-json record, and the HTML reports (without a browser)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

import invariants.htmlreport
from invariants.htmlreport import figures as F
from invariants.htmlreport.browser import png_size
from invariants.htmlreport.inputs import InputError, failure_parts, load_batch, load_suite, pass_rates, score_histogram

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "examples" / "reports"
SUBMISSION = ROOT / "examples" / "submissions" / "mask_after_softmax.py"
SIZES = {"masks": (800, 390), "param_breakdown": (900, 400), "gelu_vs_relu": (640, 360), "moe_load": (640, 360)}


# -- the figures' data ---------------------------------------------------------------------------


def test_encoder_and_decoder_weights_differ_in_every_row_but_the_last():
    encoder, decoder = F.mask_patterns().values()
    T = encoder.shape[0]
    assert np.array_equal(encoder[-1], decoder[-1])  # the last token sees every key either way: bitwise equal
    assert all(not np.allclose(encoder[i], decoder[i]) for i in range(T - 1))
    assert np.all(decoder[np.triu_indices(T, k=1)] == 0.0) and np.all(encoder > 0)
    np.testing.assert_allclose(encoder.sum(-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(decoder.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert decoder[0, 0] == 1.0  # the first token can only look at itself


def test_parameter_breakdown_is_the_accounting_exactly():
    rows = {label: (parts, total) for label, parts, total in F.param_parts()}
    totals = {label: total for label, (_, total) in rows.items()}
    assert totals == {"small": 124_439_808, "medium": 354_823_168, "large": 774_030_080, "XL": 1_557_611_200,
                      "Llama 3 8B": 8_030_261_248, "Mixtral 8x7B": 46_702_792_704, "Mixtral 8x7B\nper token (k = 2)": 12_879_925_248}
    share = {label: parts["embeddings"] / total for label, (parts, total) in rows.items()}
    assert round(100 * share["small"]) == 32 and round(100 * share["XL"]) == 5  # the lesson's 32% and 5%
    for label, (parts, total) in rows.items():
        assert sum(parts.values()) == total
        if label in ("small", "medium", "large", "XL", "Llama 3 8B"):  # dense: the feed-forward networks are the largest part
            assert max(parts, key=parts.get) == "feed_forward"
    mixtral, _ = rows["Mixtral 8x7B"]
    active, _ = rows["Mixtral 8x7B\nper token (k = 2)"]
    assert mixtral["experts"] == 4 * active["experts"]  # 8 experts loaded, 2 run


def test_gelu_against_relu_has_the_lessons_values():
    x, relu, gelu = F.gelu_curves()
    at = {float(v): float(g) for v, g in zip(x, gelu, strict=True)}
    assert round(at[1.0], 3) == 0.841 and round(at[-3.0], 3) == -0.004 and at[0.0] == 0.0
    assert np.array_equal(relu, np.maximum(x, 0))
    assert round(float(gelu.min()), 3) == -0.170 and np.all(np.abs(gelu - relu)[np.abs(x) >= 4] < 1e-3)


def test_router_loads_are_the_lessons_then_even_after_the_balancing_loss():
    loads = F.router_loads()
    assert loads.before.tolist() == [67, 56, 51, 75, 66, 75, 67, 55]  # experts 3 and 5 get 75 each, expert 2 only 51
    assert loads.before.sum() == loads.after.sum() == 512
    assert np.abs(loads.after - 64).max() <= 2 and np.abs(loads.before - 64).max() == 13
    assert loads.loss_after < loads.loss_before and round(loads.loss_before, 4) == 1.0107
    again = F.router_loads()
    assert np.array_equal(again.after, loads.after) and again.loss_after == loads.loss_after  # deterministic


def test_balancing_loss_gradient_is_autograd_through_the_torch_reference():
    torch = pytest.importorskip("torch")
    from invariants.reference.torch import load_balancing_loss

    rng = np.random.default_rng(5)
    x, router = rng.standard_normal((64, 6)), rng.standard_normal((6, 5))
    W = torch.tensor(router, requires_grad=True)
    load_balancing_loss(torch.tensor(x) @ W, 2).backward()
    np.testing.assert_allclose(F.balancing_loss_gradient(x, router, 2), W.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_figures_are_drawn_at_their_size_and_the_committed_ones_are_current():
    matplotlib = pytest.importorskip("matplotlib")
    pngs = F.draw()
    assert {name: png_size(png) for name, png in pngs.items()} == SIZES
    pinned = re.search(r"^matplotlib==(\S+)", (ROOT / "constraints.txt").read_text(), re.M)
    if pinned is None or matplotlib.__version__ != pinned.group(1):
        pytest.skip(f"matplotlib {matplotlib.__version__} is not the pinned one: the committed PNGs are not compared")
    stale = [name for name, png in pngs.items() if (ROOT / "examples" / "figures" / f"{name}.png").read_bytes() != png]
    assert not stale, f"examples/figures is out of date for {stale}: run python -m invariants.htmlreport figures"


# -- the failure text ------------------------------------------------------------------------------


def test_failure_parts_are_the_records_fields_and_other_text_stays_whole():
    fields = {"example": [["x", "float64 (2,) [0, 1]"]], "problem": "y=1, but should be 2\n  worst at index (0,)", "notes": ["@reproduce_failure"]}
    parts = failure_parts("a.b: statement", "impl", fields, "the whole text", "hint")
    assert (parts.example, parts.problem, parts.notes) == ((("x", "float64 (2,) [0, 1]"),), fields["problem"], ("@reproduce_failure",))
    assert failure_parts("a.b: s", "impl", {}, "cannot use --impl x.py: no such file\nhint: x", "h").problem == (
        "cannot use --impl x.py: no such file\nhint: x")  # a record without parts: its text whole, never split
    assert failure_parts("a.b: s", "impl", {}, "", "h").example == ()


# -- the plugin's record --------------------------------------------------------------------------


RUN = ("--pyargs", "invariants", "--impl", str(SUBMISSION), "--invariants-profile=ci", "-p", "no:cacheprovider",
       "-k", "attention.causal_non_leakage or attention.causal_gradient or layer_norm_known_values or rms_norm_scale_law")


def _without_times(record):
    return {k: v for k, v in record.items() if k != "invariants"}, [{k: v for k, v in e.items() if k != "repro"} for e in record["invariants"]]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The same run with and without xdist, the record named through TI_JSON with placeholders."""
    pytester_dir = tmp_path_factory.mktemp("runs")
    import os
    import subprocess
    import sys

    out = {}
    for name, extra in (("serial", ()), ("xdist", ("-n", "2"))):
        env = dict(os.environ, TI_JSON=f"{name}/{{impl}}-{{backend}}-{{dtype}}.json", PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-m", "pytest", *RUN, *extra, "--repro-dir", f"{name}-repro"], cwd=pytester_dir, env=env,
                              capture_output=True, text=True)
        path = pytester_dir / name / "mask_after_softmax-numpy-float64.json"
        assert path.exists(), done.stdout[-3000:]
        assert f"the run's record is in {path}" in done.stdout
        out[name] = json.loads(path.read_text())
        out[f"{name} stdout"] = done.stdout
    out["dir"] = pytester_dir
    return out


def test_the_record_has_one_entry_per_invariant_with_its_failure(records):
    record = records["serial"]
    assert record["format"] == "transformer-invariants/suite-run" and record["version"] == 1
    assert record["implementation"].endswith("mask_after_softmax.py (numpy, cpu, float64)") and record["profile"] == "ci"
    by_name = {e["invariant"]: e for e in record["invariants"]}
    assert set(by_name) == {"attention.causal_non_leakage", "attention.causal_gradient", "norms.layer_norm_known_values",
                            "norms.rms_norm_scale_law"}
    assert record["summary"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 2}
    failed = by_name["attention.causal_non_leakage"]
    assert failed["status"] == "failed" and failed["examples_to_failure"] >= 1 and failed["component"] == "attention"
    assert failed["report"].startswith("attention.causal_non_leakage: ") and failed["hint"] in failed["report"]
    assert failed["repro"].endswith("repro_attention_causal_non_leakage.py") and "CALLS = [" in failed["repro_source"]
    assert by_name["attention.causal_gradient"]["reason"].startswith("attention.causal_gradient needs the torch backend")
    skipped = by_name["norms.rms_norm_scale_law"]
    assert skipped["status"] == "skipped" and "rms_norm" in skipped["reason"] and skipped["examples"] == 0
    assert by_name["norms.layer_norm_known_values"]["reason"].startswith("held on ")


def test_the_record_is_the_same_under_xdist(records):
    assert _without_times(records["xdist"]) == _without_times(records["serial"])


def test_the_record_is_written_only_when_the_invariants_are_asked_for(pytester, monkeypatch):
    monkeypatch.setenv("TI_JSON", "record.json")
    pytester.makepyfile(test_other="def test_nothing():\n    pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not (pytester.path / "record.json").exists()


def test_a_run_refused_before_it_starts_writes_no_record(pytester):
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", "no_such_module_here", "-k", "layer_norm_known_values",
                                           "--invariants-json", "r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and not (pytester.path / "r.json").exists()
    result.stderr.fnmatch_lines(["ERROR: --impl='no_such_module_here' cannot be loaded: no module named 'no_such_module_here'"])


# -- the HTML --------------------------------------------------------------------------------------


def _self_contained(text):
    """Nothing in the page is fetched: every src is a data: URI, no stylesheet or script is linked."""
    assert not re.search(r"<link\b|<script[^>]+src=|<iframe|@import|url\((?!data:)", text)
    assert all(src.startswith("data:") for src in re.findall(r'\ssrc="([^"]*)"', text))
    assert not re.search(r'(?:src|href)="(?:https?:)?//', text)


def test_suite_report_from_records(records, tmp_path):
    paths = [records["dir"] / "serial" / "mask_after_softmax-numpy-float64.json"]
    report = load_suite(paths, max_repro_bytes=1 << 20)
    assert [c.label for c in report.columns] == ["mask_after_softmax float64"]
    (card,) = report.cards
    assert card.invariant == "attention.causal_non_leakage" and card.text.example and card.hint and card.repro_source
    text = invariants.htmlreport.render(report, generated="test")
    _self_contained(text)
    assert "<img" not in text and "<figure" not in text  # the lesson's figures are not about this failure: none in the report
    n_rows = len(report.rows)
    assert '<table class="matrix only-failing" id="matrix">' in text  # it opens on the failing row, not on every invariant
    assert f'<input type="checkbox" id="only-failing" checked> only the 1 of {n_rows} rows with a failure' in text
    assert f'href="#{card.id}"' in text and f'id="{card.id}"' in text
    assert "python " in text and "repro_attention_causal_non_leakage.py" in text and "@reproduce_failure(" in text
    said = [line.strip() for line in records["serial stdout"].splitlines() if line.startswith("  likely bug: ")]
    assert said == ["likely bug: attention.causal_non_leakage: " + card.hint], "the plugin names the likely bug"
    assert f"<li>{html.escape(said[0])}</li>" in text, "the HTML report names the same one (invariants.diagnosis.likely_bugs)"


def test_a_suite_reports_repro_script_names_no_folder_of_the_machine_that_ran_it(records, tmp_path):
    """The script finds the module by name beside it or in the current folder, and still replays the failure there."""
    import subprocess
    import sys

    text = invariants.htmlreport.suite_html([records["dir"] / "serial" / "mask_after_softmax-numpy-float64.json"], max_repro_bytes=1 << 20)
    script = html.unescape(re.search(r'<pre id="card-0-repro">(.*?)</pre>', text, re.S).group(1))
    assert "<pre>python repro_attention_causal_non_leakage.py path/to/your_solution.py</pre>" in text
    assert str(ROOT) not in script and str(records["dir"]) not in script, script
    assert "TARGET = ('mask_after_softmax.py', '')" in script and "SEARCH = None" in script, script
    (tmp_path / "repro.py").write_text(script)
    (tmp_path / "mask_after_softmax.py").write_text(SUBMISSION.read_text())
    done = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "REPRODUCES" in done.stdout, done.stderr


def test_batch_report_from_the_gate_examples():
    report = load_batch(REPORTS)
    data = [json.loads(p.read_text()) for p in sorted(REPORTS.glob("*/report.json"))]
    assert len(report.columns) == len(data)
    assert len(report.cards) == sum(i["status"] in ("failed", "error", "vacuous", "voided") for d in data for i in d["invariants"])
    rates = pass_rates(report)
    assert [r / g for _, r, g in rates] == sorted(r / g for _, r, g in rates)  # lowest first
    counts, edges = score_histogram(report)
    scored = [d for d in data if d["score"] is not None]  # a submission without a grade (not gradable) has no bar
    assert len(scored) < len(data), "the examples hold an ungradable submission"
    assert sum(counts) == len(scored) and edges[0] == 0 and edges[-1] == 100
    perfect = sum(d["score"] == d["max_score"] for d in scored)
    assert counts[-1] >= perfect
    text = invariants.htmlreport.render(report, generated="test")
    _self_contained(text)
    assert 'id="score-histogram"' in text and text.count("<rect") == len(counts)
    assert "This report is for staff" in text


def test_the_class_report_shows_the_similar_pairs_of_class_summary_md():
    report = load_batch(REPORTS)
    columns = {col.label: c for c, col in enumerate(report.columns)}
    listed = [row for row in (REPORTS / "class-summary.md").read_text().splitlines() if row.startswith("| mask\\_after")]
    assert len(report.pairs) == len(listed) == 1  # the two bugs planted in one solution
    (pair,) = report.pairs
    assert (pair.a, pair.b, pair.a_column, pair.b_column) == ("mask_after_softmax", "unbiased_variance",
                                                                columns["mask_after_softmax.py"], columns["unbiased_variance.py"])
    text = invariants.htmlreport.render(report, generated="test")
    assert f"{100 * pair.share_of_a:.0f}% | {100 * pair.share_of_b:.0f}%" in listed[0]  # the shares class-summary.md gives
    assert (f'<tr><td><a href="#sub-{pair.a_column}">mask_after_softmax</a></td><td><a href="#sub-{pair.b_column}">unbiased_variance</a></td>'
            f'<td class="mono">{100 * pair.share_of_a:.0f}%</td><td class="mono">{100 * pair.share_of_b:.0f}%</td>'
            f'<td class="mono">{html.escape(pair.spans)}</td></tr>') in text
    assert '<a href="#similar-pairs">Alike code</a>' in text


def test_a_report_without_failures_shows_every_row():
    report = load_batch(REPORTS / "good_student")
    text = invariants.htmlreport.render(report, generated="test")
    assert report.pairs is None and "similar-pairs" not in text  # one submission's folder: no pairs to show
    assert '<table class="matrix" id="matrix">' in text and 'id="only-failing">' in text


def test_docs_name_the_schema_version_the_gate_writes():
    from invariants.gate.result import SCHEMA_VERSION

    named = re.findall(r"report\.json` \(schema version (\d+)", (ROOT / "docs" / "report.md").read_text())
    assert named == [str(SCHEMA_VERSION)]


def test_bad_inputs_get_one_line(tmp_path, capsys):
    from invariants.htmlreport.__main__ import main

    (tmp_path / "x.json").write_text("{}")
    assert main(["suite", str(tmp_path / "x.json"), "-o", str(tmp_path / "r.html")]) == 2
    assert capsys.readouterr().err.strip() == f'htmlreport: {tmp_path / "x.json"}: not a suite record (expected "format": ' \
                                              "'transformer-invariants/suite-run'; write it with pytest --invariants-json)"
    assert main(["batch", str(tmp_path), "-o", str(tmp_path / "c.html")]) == 2
    assert "no report.json in it or in its sub-folders" in capsys.readouterr().err
    with pytest.raises(InputError, match="no such file"):
        load_suite([tmp_path / "missing.json"])


def test_the_batch_command_writes_a_report(tmp_path, capsys):
    from invariants.htmlreport.__main__ import main

    assert main(["batch", str(REPORTS), "-o", str(tmp_path / "class.html")]) == 0
    assert "class.html: " in capsys.readouterr().out and (tmp_path / "class.html").stat().st_size > 10_000


def test_the_committed_examples_are_small_and_self_contained():
    for name in ("report-suite.html", "report-class.html"):
        text = (ROOT / "examples" / name).read_text(encoding="utf-8")
        _self_contained(text)
        assert len(text.encode()) < 500_000, f"examples/{name} is {len(text.encode()):,} bytes"
        assert "/work/" not in text and "/tmp/" not in text  # names no folder of the machine that wrote it
    for name in ("report.png", "report-card.png", "report-class.png"):
        assert png_size((ROOT / "examples" / name).read_bytes()) == (1280, 900)
    for name, size in SIZES.items():
        assert png_size((ROOT / "examples" / "figures" / f"{name}.png").read_bytes()) == size
