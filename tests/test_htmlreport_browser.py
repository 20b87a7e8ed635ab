"""The HTML reports in a real headless Chromium: no console errors, nothing fetched, cards that open on a click, a screenshot checked.

Needs Chromium (Debian: apt-get install -y chromium; or $CHROMIUM naming one). Without it every
test here is SKIPPED with that reason, never passed: the summary line's -ra lists it. With
TI_REQUIRE_BROWSER=1 (CI, where Chromium is installed) a missing Chromium FAILS them instead.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import invariants.htmlreport
from invariants.htmlreport.browser import Browser, find_chromium, png_size

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1280, 900
NO_CHROMIUM = ("Chromium is not installed (apt-get install -y chromium, or set $CHROMIUM): "
               "the HTML reports were NOT rendered in a browser")


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        if os.environ.get("TI_REQUIRE_BROWSER"):
            pytest.fail(f"TI_REQUIRE_BROWSER is set, but {NO_CHROMIUM}", pytrace=False)
        pytest.skip(NO_CHROMIUM)
    with Browser() as b:
        yield b


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A suite report (two records: a failing submission and the reference, each on a few invariants) and the class report."""
    work = tmp_path_factory.mktemp("browser")
    records = []
    for n, target in enumerate((str(ROOT / "examples" / "submissions" / "mask_after_softmax.py"), "reference.numpy")):
        record = work / f"{n}.json"
        subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "invariants", "--impl", target, "--invariants-profile=ci",
                        "-k", "attention.causal or gelu_known or layer_norm_known", "--invariants-json", str(record), "--repro-dir", "repro",
                        "-q", "-p", "no:cacheprovider"], cwd=work, capture_output=True, check=False)
        assert json.loads(record.read_text())["invariants"], record
        records.append(record)
    suite, batch = work / "suite.html", work / "class.html"
    suite.write_text(invariants.htmlreport.suite_html(records), encoding="utf-8")
    batch.write_text(invariants.htmlreport.batch_html(ROOT / "examples" / "reports"), encoding="utf-8")
    return {"suite": suite, "batch": batch}


@pytest.mark.parametrize("kind", ["suite", "batch"])
def test_renders_with_no_console_errors_and_fetches_nothing(browser, reports, kind, record_property):
    page = browser.open(reports[kind], width=WIDTH, height=HEIGHT)
    cards = page.evaluate("document.querySelectorAll('details.card').length")
    assert cards > 0
    assert page.evaluate("document.documentElement.dataset.ready") == str(cards)  # the script ran to its end
    assert page.evaluate("document.images.length") == 0  # the lesson's figures are not in a report
    timing = page.timing()
    record_property(f"{kind}_bytes", reports[kind].stat().st_size)
    record_property(f"{kind}_load_ms", round(timing["load"]))
    print(f"{kind}: {reports[kind].stat().st_size:,} bytes, DOMContentLoaded {timing['dom_content_loaded']:.0f} ms, "
          f"load event {timing['load']:.0f} ms ({browser.version})")
    assert timing["load"] < 5000
    assert page.problems == []


def test_a_failure_card_opens_on_a_click_with_no_figure_that_is_not_about_it(browser, reports):
    page = browser.open(reports["suite"], width=WIDTH, height=HEIGHT)
    card = "document.querySelector('details.card[data-invariant=\"attention.causal_non_leakage\"]')"
    height = f"{card}.getBoundingClientRect().height"
    shown = f"{card}.querySelector('.hint').checkVisibility()"
    assert page.evaluate(f"{card}.open") is False and page.evaluate(shown) is False
    closed = page.evaluate(height)
    page.click('details.card[data-invariant="attention.causal_non_leakage"] > summary')
    assert page.evaluate(f"{card}.open") is True and page.evaluate(shown) is True
    assert page.evaluate(height) > closed + 200
    assert page.evaluate(f"{card}.querySelector('.hint').textContent").startswith("the future leaks into the past")
    assert page.evaluate(f"{card}.querySelector('table.example').rows.length") >= 2  # the shrunk example's labelled draws
    assert page.evaluate(f"{card}.querySelectorAll('img, figure, svg').length") == 0
    page.click('details.card[data-invariant="attention.causal_non_leakage"] > summary')
    assert page.evaluate(f"{card}.open") is False and page.evaluate(height) == closed
    assert page.problems == []


@pytest.mark.parametrize("kind", ["suite", "batch"])
def test_the_matrix_opens_on_its_failing_rows_and_shows_all_at_a_click(browser, reports, kind):
    page = browser.open(reports[kind], width=WIDTH, height=HEIGHT)
    rows = "document.querySelectorAll('#matrix tr.row')"
    visible = f"Array.from({rows}).filter(r => r.offsetParent !== null).length"
    failing = page.evaluate("document.querySelectorAll('#matrix tr.row.has-failure').length")
    assert page.evaluate("document.getElementById('only-failing').checked") is True
    assert 0 < page.evaluate(visible) == failing < page.evaluate(f"{rows}.length")
    page.click("#only-failing")
    assert page.evaluate(visible) == page.evaluate(f"{rows}.length")
    page.click("#only-failing")
    assert page.evaluate(visible) == failing
    assert page.problems == []


def test_a_failing_cell_opens_its_card(browser, reports):
    page = browser.open(reports["batch"], width=WIDTH, height=HEIGHT)
    target = page.evaluate("document.querySelector('td.cell.s-failed a').getAttribute('href').slice(1)")
    page.click("td.cell.s-failed a")
    page.evaluate("new Promise(r => setTimeout(r, 50))")
    assert page.evaluate(f"document.getElementById('{target}').open") is True
    assert page.problems == []


def test_the_class_report_shows_the_alike_pairs_linked_to_their_submissions(browser, reports):
    page = browser.open(reports["batch"], width=WIDTH, height=HEIGHT)
    assert page.evaluate("document.getElementById('pairs').checkVisibility()") is True
    cells = page.evaluate("Array.from(document.querySelectorAll('#pairs tr:nth-child(2) td')).map(td => td.textContent)")
    assert cells[:2] == ["mask_after_softmax", "unbiased_variance"] and cells[2].endswith("%") and " ~ " in cells[4]
    target = page.evaluate("document.querySelector('#pairs tr:nth-child(2) td a').getAttribute('href')")
    page.click("#pairs tr:nth-child(2) td a")
    page.evaluate("new Promise(r => setTimeout(r, 50))")
    assert page.evaluate("location.hash") == target and page.evaluate(f"document.querySelector('{target}').textContent").startswith("mask_after")
    assert page.problems == []


def test_screenshot_is_the_expected_size_and_not_blank(browser, reports, tmp_path):
    Image = pytest.importorskip("PIL.Image")
    page = browser.open(reports["batch"], width=WIDTH, height=HEIGHT)
    png = page.screenshot()
    (tmp_path / "class.png").write_bytes(png)
    assert png_size(png) == (WIDTH, HEIGHT)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # text, badges, bars: far from one flat colour
    white = next((n for n, c in colours if c == (255, 255, 255)), 0)
    assert 0.3 < white / (WIDTH * HEIGHT) < 0.98  # mostly page, but with something on it
    histogram_blue = sum(n for n, c in colours if c == (37, 99, 235))  # #2563eb, the score histogram's bars
    assert histogram_blue > 1000
    assert page.problems == []
