"""`autoloop watch`: the frame drawn from the dashboard's views (every worker in flight,
agents' text shown as text), `--once` reading results/ without writing it, the one-line
errors, and the real thing in a real terminal: tmux on a private socket, a night running
on the scripted stand-in, the trial in flight on screen, `q` and Ctrl-C quitting with exit
status 0 (SIGTERM ending it with 143), the terminal's settings restored after each, and the
night going on.

tmux comes from Debian (`apt-get install tmux`, as .ci/run does). Without it the terminal
test is skipped, except in CI (CI=true), where a missing tmux is a failure.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers.loop import read_ledger
from helpers.night import build_night, realistic_steps
from helpers.watch import cli_env, fake, fake_repo, queue, run_args

pytest.importorskip("rich")

from rich.console import Console

from autoloop.review.dashboard.views import WorkspaceViews
from autoloop.review.watch.frame import clean, curve_lines, frame

EVIL = "[bold red]markup[/] \x1b[2J\x1b]0;title\x07 cleared \u202eevil\u202c\nsecond line"


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """A finished night with two workers in flight on top: w1 training, w0 proposing (read
    only by the tests, so built once)."""
    built = build_night(tmp_path_factory.mktemp("night"), realistic_steps(), tag="t")
    results = built.results
    state = json.loads((results / "state.json").read_text())
    (results / "state.json").write_text(json.dumps({**state, "phase": "idle", "workers": 2, "pid": os.getpid()}))
    (results / "state-w1.json").write_text(json.dumps({
        "tag": "t", "phase": "running", "trial": 31, "attempt": 1, "kind": "candidate", "description": EVIL,
        "attempt_started_at": time.time() - 5, "progress": "step 00010 (40.0%) | loss: 2.5000"}))
    (results / "state-w0.json").write_text(json.dumps({
        "tag": "t", "phase": "proposing", "trial": 32, "attempt": 1, "kind": "candidate", "proposer": "mutate",
        "attempt_started_at": time.time() - 50}))
    return built


def render(renderable, width: int = 140) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(renderable)
    return console.file.getvalue()


def test_the_frame_shows_every_worker_in_flight_and_the_night(night):
    text = render(frame(WorkspaceViews(night.repo), last=5, width=140))
    lines = text.splitlines()
    w1 = next(line for line in lines if "#31" in line)
    assert "w1" in w1 and "running" in w1 and "40%" in w1 and "2.5000" in w1
    w0 = next(line for line in lines if "#32" in line)
    assert "w0" in w0 and "proposing" in w0 and "(mutate at work)" in w0
    best = next(r for r in reversed(night.records) if r.best_metric is not None).best_metric
    assert f"best val_bpb {best:.6f}" in text
    # the last five attempts, the newest last
    assert [line.split()[0] for line in lines if line.strip().startswith(("#2", "#1"))][-5:] == \
        [f"#{r.trial}" for r in night.records[-5:]]
    assert "running best val_bpb" in text and "█" in text
    # In a short window the list of attempts shrinks so the frame fits.
    short = render(frame(WorkspaceViews(night.repo), last=10, width=140, height=24)).splitlines()
    assert len(short) == 24 and short[-10].startswith("last 8 attempts") and short[-1].startswith(" #28")


def test_agents_text_is_shown_as_text(night):
    text = render(frame(WorkspaceViews(night.repo), width=200), width=200)
    assert "[bold red]markup[/]" in text          # not parsed as rich markup
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "cleared evil second line" in text     # line breaks as spaces, the bidi override gone
    assert clean("a\tb\nc\x00d\x9be\u2066f") == "a b cdef"
    assert clean("x" * 500, limit=10) == "x" * 9 + "…"
    assert clean(None) == ""


def test_the_running_best_as_blocks():
    falling = [3.0, 2.0, 2.0, 1.0]
    lines = [line.plain for line in curve_lines(falling, width=8, height=2)]
    assert lines[0].startswith("   3.000000 ┤") and lines[1].startswith("   1.000000 ┤")
    columns = list(zip(*(line.split("┤")[1] for line in lines), strict=True))
    assert len(columns) == 8                      # each value stretched to two columns
    assert columns[0] == ("█", "█") and columns[-1] == (" ", "▁")
    many = [float(i) for i in range(1000)]
    assert {len(line.plain.split("┤")[1]) for line in curve_lines(many, width=50)} == {50}
    assert curve_lines([], width=50)[0].plain == "(no result yet)"
    flat = curve_lines([1.5, 1.5], width=8)
    assert flat[0].plain.startswith("   1.500000")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def test_once_prints_a_frame_and_writes_nothing(night):
    before = snapshot(night.results)
    env = {**os.environ, "COLUMNS": "150"}
    once = subprocess.run([sys.executable, "-m", "autoloop.cli", "watch", "--once"], cwd=night.repo, env=env,
                          capture_output=True, text=True, timeout=120)
    assert once.returncode == 0, once.stderr
    assert "#31" in once.stdout and "#32" in once.stdout and once.stderr == ""
    assert snapshot(night.results) == before


def test_the_one_line_errors(night, capsys, monkeypatch):
    from autoloop.cli.main import main

    # Without --once it needs a terminal to draw on (here stdout is pytest's capture).
    assert main(["watch", "-C", str(night.repo)]) == 1
    assert capsys.readouterr().err == "autoloop: watch: stdout is not a terminal (--once prints one frame)\n"
    # Without rich: what to install.
    for name in ("rich", "rich.console", "rich.live"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["watch", "--once", "-C", str(night.repo)]) == 1
    assert capsys.readouterr().err == "autoloop: watch needs rich: pip install 'autoloop[watch]'\n"


# ------------------------------------------------------------------------------ a real terminal


class Tmux:
    """A tmux server of the test's own (a private socket) with one detached session."""

    def __init__(self, env: dict):
        self.socket = f"autoloop-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = env

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], env=self.env,
                              capture_output=True, text=True, timeout=60)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "watch").stdout

    def kill(self) -> None:
        self("kill-server")


def wait(predicate, what: str, timeout: float = 120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def tmux_env():
    if shutil.which("tmux") is None:
        why = "tmux not found (apt-get install tmux)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the terminal test: {why}")
        pytest.skip(why)


def test_a_hang_up_ends_it_quietly(night, tmp_path, tmux_env):
    """The terminal goes away under it (an SSH connection dropped): it ends with 129, the
    status of a hang-up, and leaves nothing behind (no internal-error log under results/)."""
    before = snapshot(night.results)
    tmux = Tmux({k: v for k, v in os.environ.items() if k != "TMUX"})
    # The pane's shell outlives the hang-up (a HUP trap) to save the exit status.
    (tmp_path / "script.sh").write_text(
        f"trap 'true' HUP\ncd {night.repo}\n{sys.executable} -m autoloop.cli watch --interval 0.2 2> {tmp_path}/err\n"
        f"echo $? > {tmp_path}/rc.tmp; mv {tmp_path}/rc.tmp {tmp_path}/rc\n")
    try:
        assert tmux("new-session", "-d", "-s", "watch", "-x", "120", "-y", "40",
                    f"bash {tmp_path}/script.sh").returncode == 0
        wait(lambda: "#31" in tmux.screen(), "the frame")
    finally:
        tmux.kill()
    rc = wait(lambda: (tmp_path / "rc").exists() and (tmp_path / "rc").read_text().strip(), "the exit status")
    assert rc == "129", (tmp_path / "err").read_text()
    assert (tmp_path / "err").read_text() == ""
    assert snapshot(night.results) == before


def test_watch_in_a_real_terminal(tmp_path, tiny_data_dir, tmux_env):
    repo = fake_repo(tmp_path)
    queue(repo, "01_better.py", fake(A=0.5), "a first change")
    queue(repo, "02_hold.py", fake(A=0.5, B=1.5, HOLD=True), "held until results/go")
    env = {k: v for k, v in cli_env(tiny_data_dir).items() if k != "TMUX"}
    loop = subprocess.Popen(run_args(), cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out = tmp_path / "pane"
    out.mkdir()
    # The pane runs watch three times (ended by q, Ctrl-C, SIGTERM), saving each exit status
    # and the terminal's settings before and after (stty -g: the settings alone; stty -a also
    # prints the window's size and wraps to its width, which moved under load), then stays open.
    watch = f"{sys.executable} -m autoloop.cli watch --interval 0.2"
    runs = "".join(f"{watch}; echo $? > {out}/rc{n}.tmp; stty -g > {out}/after{n}; mv {out}/rc{n}.tmp {out}/rc{n}\n"
                   for n in (1, 2, 3))
    (out / "script.sh").write_text(f"cd {repo}\nstty -g > {out}/before\n{runs}echo pane-done; sleep 600\n")
    tmux = Tmux(env)
    try:
        state = repo / "results" / "state.json"
        wait(lambda: state.exists() and '"phase": "running"' in state.read_text() and '"trial": 2' in state.read_text(),
             "trial 2 to be running")
        started = tmux("new-session", "-d", "-s", "watch", "-x", "150", "-y", "45", f"bash {out}/script.sh")
        assert started.returncode == 0, started.stderr
        for n, key, status in ((1, "q", "0"), (2, "C-c", "0"), (3, None, "143")):
            screen = wait(lambda: "held until results/go" in (s := tmux.screen()) and s, f"frame {n}")
            flight = next(line for line in screen.splitlines() if "#2 " in line and "held until" in line)
            assert "running" in flight and "candidate" in flight
            assert "a first change" in screen and "q quits" in screen
            if key:
                assert tmux("send-keys", "-t", "watch", key).returncode == 0
            else:   # SIGTERM to the watch process, the pane's shell's one child
                shell = psutil.Process(int(tmux("display-message", "-p", "-t", "watch", "#{pane_pid}").stdout))
                [child] = shell.children()
                child.terminate()
            rc_file = out / f"rc{n}"
            rc = wait(lambda f=rc_file: f.exists() and f.read_text().strip(), f"exit {n}")
            assert rc == status, f"watch {n} ({key or 'SIGTERM'}) exited {rc}"
            assert (out / f"after{n}").read_text() == (out / "before").read_text(), "terminal not restored"
        wait(lambda: "pane-done" in tmux.screen(), "the pane's script to end")
        assert "held until" not in tmux.screen()   # the alternate screen is gone
        # The night went on all along: trial 2 finishes once released.
        assert loop.poll() is None
        (repo / "results" / "go").touch()
        output, _ = loop.communicate(timeout=120)
        assert loop.returncode == 0, output
        assert [(r["trial"], r["status"]) for r in read_ledger(repo)] == [(0, "keep"), (1, "keep"), (2, "keep")]
    finally:
        tmux.kill()
        if loop.poll() is None:
            loop.kill()
            loop.wait()
