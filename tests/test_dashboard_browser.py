"""The dashboard in a real browser (headless Chromium driven by selenium through Debian's
chromedriver) against a night that is running: the page loads without console errors, the
table shows the ledger's rows, a new attempt appears without a reload, an attempt's diff
opens, and a description full of HTML is shown as text.

Chromium and chromedriver come from Debian (`apt-get install chromium chromium-driver`, as
.ci/run does); nothing is downloaded at run time. Without them the test is skipped, except
in CI (CI=true), where a missing browser is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers.loop import read_ledger
from helpers.watch import DashboardProcess, cli_env, fake, fake_repo, queue, run_args

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
EVIL = '<img src=x onerror="window.__pwned = 1"><b>bold</b> & "quoted" <script>window.__pwned = 2</script>'


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if not CHROMIUM or not CHROMEDRIVER:
        return "chromium/chromedriver not found (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture
def browser():
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="autoloop-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1300"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(predicate, what: str, timeout: float = 120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def table_rows(driver) -> list[tuple[str, str, str]]:
    return [tuple(row) for row in driver.execute_script(
        "return [...document.querySelectorAll('#attempts tbody tr')].map("
        "tr => [tr.dataset.label, tr.children[1].textContent, tr.querySelector('td.desc').textContent])")]


def test_the_dashboard_of_a_running_night(tmp_path, tiny_data_dir, browser):
    from selenium.webdriver.common.by import By

    repo = fake_repo(tmp_path)
    queue(repo, "01_html.py", fake(A=0.5), EVIL)
    queue(repo, "02_hold.py", fake(A=0.5, B=1.5, HOLD=True), "held until results/go")
    loop = subprocess.Popen(run_args(), cwd=repo, env=cli_env(tiny_data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        state = repo / "results" / "state.json"
        wait(lambda: state.exists() and '"phase": "running"' in state.read_text() and '"trial": 2' in state.read_text(),
             "trial 2 to be running")
        ledger = read_ledger(repo)
        assert [r["trial"] for r in ledger] == [0, 1] and ledger[1]["description"] == EVIL

        with DashboardProcess(repo) as dash:
            browser.get(dash.url)
            wait(lambda: len(table_rows(browser)) == 2, "the table")
            # The table shows the ledger's rows, the HTML description as text.
            assert table_rows(browser) == [("0", "baseline", "baseline"), ("1", "keep", EVIL)]
            assert browser.find_elements(By.CSS_SELECTOR, "#attempts tbody img, #attempts tbody b, "
                                                          "#attempts tbody script") == []
            assert browser.execute_script("return window.__pwned") is None
            # The trial in flight, with its live log.
            live = wait(lambda: browser.execute_script(
                "const c = document.querySelector('#live .live-card'); return c && c.textContent"), "the live card")
            assert "#2" in live and "held until results/go" in live
            wait(lambda: "step 00003" in browser.execute_script(
                "const p = document.querySelector('#live pre'); return p ? p.textContent : ''"), "the live log")

            # A new attempt appears without a reload.
            browser.execute_script("window.__same_page = 42")
            (repo / "results" / "go").touch()
            wait(lambda: len(table_rows(browser)) == 3, "the new attempt in the table")
            assert browser.execute_script("return window.__same_page") == 42
            assert table_rows(browser)[2] == ("2", "keep", "held until results/go")
            wait(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#chart .pt")) == 3, "the new point in the plot")
            assert "#2" not in (browser.execute_script(
                "const c = document.querySelector('#live .live-card'); return c ? c.textContent : ''") or "")

            # An attempt's diff opens: the one with the HTML description, as git has it.
            browser.find_element(By.CSS_SELECTOR, '#attempts tbody tr[data-label="1"]').click()
            wait(lambda: "diff --git" in browser.execute_script(
                "return document.getElementById('detail-diff').textContent"), "the diff")
            record = read_ledger(repo)[1]
            diff = subprocess.run(["git", "diff", record["parent"], record["commit"]], cwd=repo, capture_output=True,
                                  text=True, check=True).stdout
            shown = browser.execute_script("return document.getElementById('detail-diff').textContent")
            assert shown.rstrip("\n") == diff.rstrip("\n")
            fields = browser.execute_script("return document.getElementById('detail-fields').textContent")
            assert EVIL in fields
            assert browser.find_elements(By.CSS_SELECTOR, "#detail img, #detail b, #detail script") == []
            assert browser.execute_script("return window.__pwned") is None

            shot = tmp_path / "dashboard.png"
            browser.save_screenshot(str(shot))
            if os.environ.get("AUTOLOOP_SCREENSHOT_DIR"):   # for a person to look at
                shutil.copy(shot, Path(os.environ["AUTOLOOP_SCREENSHOT_DIR"]) / "dashboard.png")
            logs = browser.get_log("browser")
            assert [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")] == [], logs
        out = loop.communicate(timeout=120)[0]
        assert loop.returncode == 0, out
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()


def test_verify_runs_are_listed_as_verify_and_left_out_of_the_chart(tmp_path, tiny_data_dir, browser):
    """`autoloop verify`'s re-runs (kind verify, status discard) are measurements of the
    best, not proposals the night turned down: the table says "verify", the chart and its
    note count only the night's attempts."""
    from autoloop.store.ledger import Ledger, LedgerRecord

    repo = fake_repo(tmp_path)
    queue(repo, "01_better.py", fake(A=0.5), "a real gain")
    proc = subprocess.run(run_args(), cwd=repo, env=cli_env(tiny_data_dir), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    night = [LedgerRecord.model_validate(r) for r in read_ledger(repo)]
    assert [r.trial for r in night] == [0, 1]
    # A verification's record as verify.py writes it: a trial of its own, kind verify, discard.
    Ledger(repo / "results").append(night[1].model_copy(update={
        "trial": 2, "attempt": 1, "kind": "verify", "status": "discard", "description": "verify: the best, seed 50"}))

    with DashboardProcess(repo) as dash:
        browser.get(dash.url)
        wait(lambda: len(table_rows(browser)) == 3, "the table")
        assert [row[:2] for row in table_rows(browser)] == [("0", "baseline"), ("1", "keep"), ("2", "verify")]
        wait(lambda: len(browser.find_elements("css selector", "#chart .pt")) == 2, "the chart's points")
        note = browser.execute_script("return document.getElementById('plot-note').textContent")
        assert note.startswith("2 attempts:") and "0 discarded" in note, note
        logs = browser.get_log("browser")
        assert [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")] == [], logs


def test_the_live_view_shows_the_look_ahead_and_the_prepared_candidates(tmp_path, tiny_data_dir, browser):
    """#16: the next trial's proposal, made while one trains, gets a card of its own, and the
    candidates prepared and waiting are named; an agent's text there is text too."""
    import json

    repo = fake_repo(tmp_path)
    queue(repo, "01_better.py", fake(A=0.5), "a real gain")
    proc = subprocess.run(run_args(), cwd=repo, env=cli_env(tiny_data_dir), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The state files as a night with --lookahead 1 leaves them mid-trial: 2 trains, 3 is proposed.
    results = repo / "results"
    now = time.time()
    state = json.loads((results / "state.json").read_text())
    (results / "state.json").write_text(json.dumps({**state, "phase": "running", "trial": 2, "attempt": 1,
                                                    "kind": "candidate", "description": "trains now",
                                                    "attempt_started_at": now - 20}))
    (results / "state-ahead.json").write_text(json.dumps({"tag": "t", "phase": "proposing", "trial": 3, "attempt": 1,
                                                          "kind": "candidate", "description": EVIL,
                                                          "attempt_started_at": now - 4}))
    (results / "prepared").mkdir(exist_ok=True)
    (results / "prepared" / "4.json").write_text("{}")

    with DashboardProcess(repo) as dash:
        browser.get(dash.url)
        cards = wait(lambda: (lambda c: c if len(c) == 2 else None)(browser.execute_script(
            "return [...document.querySelectorAll('#live .live-card')].map(c => c.textContent)")), "two live cards")
        assert "#2" in cards[0] and "trains now" in cards[0]
        assert "#3" in cards[1] and "look-ahead" in cards[1] and "prepares the next trial" in cards[1]
        assert EVIL in cards[1] and browser.execute_script("return window.__pwned") is None
        assert browser.find_elements("css selector", "#live img, #live b, #live script") == []
        prepared = browser.execute_script("const p = document.querySelector('#live .live-prepared'); "
                                          "return p ? p.textContent : ''")
        assert prepared == "prepared, waiting to run: #4"
        logs = browser.get_log("browser")
        assert [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")] == [], logs


def test_the_cards_before_any_candidate_show_the_baseline_as_the_mean_of_its_runs(tmp_path, tiny_data_dir, browser):
    """A night of the baseline and its 2 noise samples (seeds whose runs land above the
    baseline's own): the best is the baseline, the mean of its 3 runs with their σ, no
    improvement and nothing "worse"; keeps are 0 and the samples counted apart; the running
    best is flat at that mean, not stepping up to a sample."""
    import re
    import statistics

    from helpers.git import init_repo
    from helpers.loop import autoloop

    source = (Path(__file__).parent / "trial_scripts" / "known_value.py").read_text()
    repo = init_repo(tmp_path / "repo", {"train.py": source.replace("WARMUP = 10 ", "WARMUP = 16 ", 1)})
    proc = autoloop(repo, "run", "--budget", "1", "--proposer", "queue", "--tag", "t", "--noise-runs", "2",
                    data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [r["metric"] for r in read_ledger(repo)]
    assert len(runs) == 3 and runs[0] < min(runs[1:])   # each sample raises the engine's mean
    mean, sigma = statistics.mean(runs), statistics.stdev(runs)

    with DashboardProcess(repo) as dash:
        browser.get(dash.url)
        wait(lambda: len(browser.find_elements("css selector", "#chart .pt")) == 3, "the chart's points")
        cards = {k: (v, s) for k, v, s in browser.execute_script(
            "return [...document.querySelectorAll('#cards .card')].map(c => [...c.children].map(n => n.textContent))")}
        assert cards["best val_bpb"][0] == f"{mean:.6f}" and cards["best val_bpb"][1].startswith("#0 baseline ")
        assert cards["baseline"] == (f"{mean:.6f}", f"mean of 3 runs, σ {sigma:.6f}; lower is better")
        assert cards["improvement"] == ("0.0000", "no change has beaten the baseline yet")
        assert cards["attempts"] == ("3", "1 trials: keep 0, noise samples 2")
        path = browser.execute_script("return document.querySelector('#chart path.running-best').getAttribute('d')")
        assert re.fullmatch(r"M[\d.]+,[\d.]+H[\d.]+", path), path   # one level: the mean, no step
        note = browser.execute_script("return document.getElementById('plot-note').textContent")
        assert note == "3 attempts: 0 kept changes, 2 noise samples, 0 discarded, 0 crashed", note
        logs = browser.get_log("browser")
        assert [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")] == [], logs


def test_the_study_across_nights_is_plotted_with_only_comparable_nights(tmp_path, tiny_data_dir, browser):
    """Two nights run for real (the second starts where the first stopped) and a third, archived
    with another budget: the study's panel lists all three and plots the running best of the two
    comparable ones; the other is listed as not comparable, not plotted."""
    import json
    import shutil as sh

    from selenium.webdriver.common.by import By

    repo = fake_repo(tmp_path)
    queue(repo, "01_better.py", fake(A=0.5), "a first gain")
    first = subprocess.run(run_args(tag="n1"), cwd=repo, env=cli_env(tiny_data_dir), capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    queue(repo, "02_better.py", fake(A=0.5, B=1.0), "a second gain")
    second = subprocess.run(run_args(tag="n2"), cwd=repo, env=cli_env(tiny_data_dir), capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    archived = next((repo / "results" / "archive").glob("n1-*"))
    other = archived.parent / "short-20000101-000000"
    sh.copytree(archived, other)
    info = json.loads((other / "night.json").read_text())
    (other / "night.json").write_text(json.dumps({**info, "tag": "short", "budget_s": 60.0}))

    with DashboardProcess(repo) as dash:
        browser.get(dash.url)
        wait(lambda: browser.execute_script("return !document.getElementById('history-panel').hidden"),
             "the study's panel")
        tags = browser.execute_script(
            "return [...document.querySelectorAll('#history tbody tr')].map(tr => tr.dataset.tag)")
        assert sorted(tags) == ["n1", "n2", "short"]
        points = browser.find_elements(By.CSS_SELECTOR, "#history-chart .history-pt")
        assert [p.get_attribute("data-tag") for p in points] == ["n1", "n2"]
        assert len(browser.find_elements(By.CSS_SELECTOR, "#history-chart path.history-line")) == 1
        short = browser.execute_script(
            "return document.querySelector('#history tbody tr[data-tag=\"short\"]').textContent")
        assert "no: budget 60s, not 1s" in short
        # The running best steps down from the first night's 2.5 to the second's 1.5.
        titles = [p.find_element(By.TAG_NAME, "title").get_attribute("textContent") for p in points]
        assert titles == ["n1: best 2.5000, study best 2.5000", "n2: best 1.5000, study best 1.5000"]
        logs = browser.get_log("browser")
        assert [entry for entry in logs if entry["level"] in ("SEVERE", "WARNING")] == [], logs
