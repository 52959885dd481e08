"""The dashboard's guards and trade-offs panel in a real browser (the browser fixture and its
skip rules are tests/test_dashboard_browser.py's): after a night whose guard turned a win
down, the panel lists the guard and its breach, and draws the front against peak memory and
against tokens/s, the kept attempts marked.
"""

from __future__ import annotations

from helpers.watch import DashboardProcess
from test_dashboard_browser import browser, wait  # noqa: F401 - the fixture, used by name
from test_guards import foreign_night


def test_the_dashboard_shows_the_guards_and_the_front(tmp_path, tiny_data_dir, browser):  # noqa: F811
    repo = foreign_night(tmp_path, tiny_data_dir)
    with DashboardProcess(repo) as dash:
        browser.get(dash.url)
        wait(lambda: browser.execute_script("return document.querySelectorAll('#tradeoffs svg.front').length") == 2,
             "the two trade-off charts")
        guards = browser.execute_script("return document.getElementById('guards').textContent")
        assert "peak_vram_mb <= 1.5 * baseline" in guards and "breached by 1 attempt: #1 (400 vs 150)" in guards
        memory = browser.execute_script(
            "return [...document.querySelectorAll('svg.front[data-axis=peak_vram_mb] circle')].map("
            "c => [c.querySelector('title').textContent, c.classList.contains('kept'), c.classList.contains('front')])")
        shown = {title.split(":")[0]: (kept, front) for title, kept, front in memory}
        assert shown == {"#0": (True, False), "#1": (False, True), "#2": (True, True), "#3": (False, True)}
        assert browser.execute_script("return document.querySelectorAll('svg.front polyline.kept-line').length") == 2
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
