"""`--notify` and `--on` on short real nights (real CLI, real git, the scripted stand-in of
helpers/watch.py): a local HTTP server is the notification target (apprise's json:// form),
hooks are real shell commands in the night's containment."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from helpers.loop import read_ledger
from helpers.watch import fake, fake_repo, queue, run_night

from autoloop.core.night_events import NightEvent, failure_cause, safe_text
from autoloop.observe.event_watch import EventWatch
from autoloop.store.ledger import LedgerRecord

pytest.importorskip("apprise")

SECRET = "s3cr3t-" + uuid.uuid4().hex[:12]


class Target:
    """A local webhook: records every POST (path, headers, JSON body); answers ``status``."""

    def __init__(self, status: int = 200):
        self.status = status
        self.posts: list[tuple[str, dict, dict]] = []
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target.posts.append((self.path, dict(self.headers), json.loads(body or b"{}")))
                self.send_response(target.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        # The secret travels as a header filled in from the environment at send time.
        self.url = f"json://127.0.0.1:{self.server.server_port}/night?+X-Token=${{NOTIFY_TOKEN}}"

    def titles(self) -> list[str]:
        return [body["title"] for _, _, body in self.posts]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target():
    t = Target()
    yield t
    t.close()


def night_queue(repo: Path) -> None:
    """Two new bests, a discard, then three crashes in a row (three different typos: the
    duplicate gate would skip a repeated one)."""
    queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
    queue(repo, "02_lower_more.py", fake(A=0.25), "lower a more @everyone\x1b[31m")
    queue(repo, "03_raise_b.py", fake(A=0.25, B=3.0), "raise b")
    for i, a in enumerate((0.2, 0.15, 0.1)):
        queue(repo, f"0{4 + i}_typo.py", fake(A=a).replace('print("---")', 'print("---"'), f"typo {i}")


def everything_written(repo: Path) -> str:
    """Every file under results/ (ledger, results.tsv, state, logs, hooks' files) as text."""
    return "\n".join(p.read_text(errors="replace") for p in (repo / "results").rglob("*")
                     if p.is_file() and p.suffix not in (".png", ".db"))


def test_notify_one_message_per_new_best_a_crash_streak_and_the_end_no_secret_kept(
        tmp_path, tiny_data_dir, target):
    repo = fake_repo(tmp_path)
    night_queue(repo)
    proc = run_night(repo, tiny_data_dir, "--notify", target.url, "--notify-every", "0",
                     env={"NOTIFY_TOKEN": SECRET})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    titles = target.titles()
    assert [t.split(":")[1].strip().split()[0] for t in titles] == ["new", "new", "3", "the"], titles
    assert "new best val_bpb 2.5000 (-0.5000" in titles[0] and "new best val_bpb 2.2500 (-0.2500" in titles[1]
    assert "3 crashes in a row" in titles[2] and "the night ended" in titles[3]
    bodies = [body["message"] for _, _, body in target.posts]
    assert "lower a more" in bodies[1] and "@everyone" not in bodies[1] and "\x1b" not in bodies[1]
    assert "val_bpb 3.0000 -> 2.2500" in bodies[3] and "2 kept changes" in bodies[3] and "3 crashes" in bodies[3]
    # The secret reached the target, and nothing the night wrote or printed.
    assert {headers["X-Token"] for _, headers, _ in target.posts} == {SECRET}
    assert SECRET not in everything_written(repo) + proc.stdout + proc.stderr
    assert "NOTIFY_TOKEN" not in (repo / "results" / "results.tsv").read_text()


def test_notify_rate_limit_and_three_tries_then_one_said_failure(tmp_path):
    from autoloop.observe.notify import TRIES, Notifier

    failing = Target(status=500)
    said: list[str] = []
    try:
        notifier = Notifier([failing.url], every_s=600, warn=said.append, pause_s=0,
                            environ={"NOTIFY_TOKEN": SECRET})
        event = lambda kind: NightEvent(kind, "t", kind, "text")   # noqa: E731
        assert notifier.send(event("new_best")) and not notifier.send(event("new_best"))
        assert notifier.held_back == {"new_best": 1}
        # Waited for, not timed: the first event's tries, then one said failure.
        deadline = time.monotonic() + 120
        while len(said) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(failing.posts) == TRIES and len(said) == 1
        assert "new_best not delivered after 3 tries" in said[0] and SECRET not in said[0], said
        assert notifier.send(event("crash_streak"))
        assert notifier.send(event("night_end")) and notifier.send(event("night_end"))   # the end always goes out
        notifier.close()
    finally:
        failing.close()
    # A target that failed gets one try per later event (crash_streak unless the close came
    # first, and both ends), and its failures are not said again.
    assert TRIES + 2 <= len(failing.posts) <= TRIES + 3 and len(said) == 1
    assert failing.titles()[-1] == "night_end"


def test_a_failing_target_neither_slows_nor_stops_the_night(tmp_path, tiny_data_dir):
    failing = Target(status=500)
    try:
        repo = fake_repo(tmp_path)
        queue(repo, "01_lower_a.py", fake(A=0.5), "lower a")
        queue(repo, "02_raise_b.py", fake(A=0.5, B=3.0), "raise b")
        t0 = time.monotonic()
        proc = run_night(repo, tiny_data_dir, "--notify", failing.url, "--notify-every", "0",
                         env={"NOTIFY_TOKEN": SECRET})
        took = time.monotonic() - t0
    finally:
        failing.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    judged = [r for r in read_ledger(repo) if r["status"] != "skip"]
    assert len(judged) == 3   # the baseline and both queued changes: every one ran
    warnings = [line for line in proc.stdout.splitlines() if "not delivered" in line]
    assert len(warnings) == 1 and "new_best" in warnings[0] and SECRET not in proc.stdout, proc.stdout
    assert len(failing.posts) >= 2   # it was tried: each event at least once (tries: the test above)
    print(f"night with a failing notification target: {took:.1f}s (benchmarks/notify_delay.py compares)")


def test_a_missing_variable_or_a_malformed_url_is_one_line_before_anything_runs(tmp_path, tiny_data_dir):
    repo = fake_repo(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_TOKEN"}
    proc = run_night(repo, tiny_data_dir, "--notify", "json://127.0.0.1:9/x?+X-Token=${NOTIFY_TOKEN}", env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "${NOTIFY_TOKEN} is not set in the environment" in proc.stderr.strip().splitlines()[-1]
    assert not (repo / "results" / "ledger.jsonl").exists() or not read_ledger(repo)
    proc = run_night(repo, tiny_data_dir, "--notify", "nowhere")
    assert proc.returncode != 0 and "is not a notification URL" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------ hooks


def test_hooks_get_the_event_json_on_stdin_a_failing_one_leaves_the_night_running_a_hanging_one_ends(
        tmp_path, tiny_data_dir):
    from jsonschema import validate

    from autoloop.review.json_forms import schema

    repo = fake_repo(tmp_path)
    night_queue(repo)
    out = tmp_path / "hook-out"
    out.mkdir()
    marker = f"hang-{uuid.uuid4().hex}"
    hang = f"{sys.executable} -c 'import time; time.sleep(600)' {marker}"
    proc = run_night(
        repo, tiny_data_dir,
        "--on", f"night_end=cat > {out}/$AUTOLOOP_EVENT.json; echo \"$AUTOLOOP_TAG $AUTOLOOP_EVENT\" > {out}/env",
        "--on", "new_best=echo failing on purpose; exit 3",
        "--on", f"crash_streak={hang}", "--hook-timeout", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The failing hook (on the first new best) left the night running: every change ran.
    assert len([r for r in read_ledger(repo) if r["status"] != "skip"]) == 7
    failed = [line for line in proc.stdout.splitlines() if "hook new_best: failed (exit code 3)" in line]
    assert len(failed) == 2, proc.stdout
    # The hanging one was ended at its limit, its whole tree with it.
    assert "hook crash_streak: ended at its limit of 2s" in proc.stdout, proc.stdout
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    # The end's JSON on stdin matches its schema, and the environment says the same.
    event = json.loads((out / "night_end.json").read_text())
    validate(event, schema("event"))
    assert event["kind"] == "night_end" and event["data"]["kept"] == 2 and event["data"]["crashes"] == 3
    assert (out / "env").read_text().split() == ["t", "night_end"]
    kept = sorted((repo / "results" / "hooks").glob("*.json"))
    assert [p.name.split("-", 1)[1] for p in kept] == ["new_best.json", "new_best.json", "crash_streak.json",
                                                       "night_end.json"]
    for path in kept:
        validate(json.loads(path.read_text()), schema("event"))
    assert "failing on purpose" in (repo / "results" / "hooks" / "1-new_best.log").read_text()


AGENT = """import sys
sys.stdin.read()
print("Error: Invalid API key · Please run /login")
sys.exit(1)
"""


@pytest.mark.parametrize("case", ["low disk", "an error", "an agent without its key"])
def test_the_stop_events_each_with_the_end_last(case, tmp_path, tiny_data_dir):
    from jsonschema import validate

    from autoloop.review.json_forms import schema

    repo = fake_repo(tmp_path)
    out = tmp_path / "hook-out"
    out.mkdir()
    capture = f"cat > {out}/$AUTOLOOP_EVENT.json"
    args = [arg for kind in ("low_disk", "stopped_by_error", "proposer_failures", "night_end")
            for arg in ("--on", f"{kind}={capture}")]
    env = {}
    if case == "low disk":
        args += ["--min-free-gb", "1000000"]
    elif case == "an error":
        env["AUTOLOOP_FAULT_WRITE"] = "ENOSPC:ledger.jsonl:1"   # the baseline's record cannot be written
    else:
        agent = tmp_path / "agent.py"
        agent.write_text(AGENT)
        args += ["--proposer", "agent", "--agent-cmd", f"{sys.executable} {agent}", "--skip-preflight",
                 "--max-agent-failures", "3", "--lookahead", "0"]
    proc = run_night(repo, tiny_data_dir, *args, env=env)
    assert proc.returncode == (1 if case == "an error" else 0), proc.stdout + proc.stderr
    events = {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}
    for event in events.values():
        validate(event, schema("event"))
    expected = {"low disk": "low_disk", "an error": "stopped_by_error", "an agent without its key": "proposer_failures"}
    assert sorted(events) == sorted([expected[case], "night_end"]), proc.stdout
    assert events["night_end"]["time"] >= events[expected[case]]["time"]
    if case == "low disk":
        assert events["low_disk"]["data"]["reason"].startswith("low disk:")
    elif case == "an error":
        assert "No space left on device" in events["stopped_by_error"]["text"]
        assert events["night_end"]["data"]["reason"] == "stopped by an error"
    else:
        data = events["proposer_failures"]["data"]
        assert data["cause"] == "auth" and data["count"] == 3 and "Invalid API key" in data["reason"]
        assert "failed 3 times in a row" in events["night_end"]["data"]["reason"]


def test_an_unknown_hook_event_is_one_line(tmp_path, tiny_data_dir):
    repo = fake_repo(tmp_path)
    proc = run_night(repo, tiny_data_dir, "--on", "new_worst=true")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "unknown event 'new_worst'" in proc.stderr


# ------------------------------------------------------------------------------ the pure parts


def skip(reason: str, trial: int) -> LedgerRecord:
    return LedgerRecord(trial=trial, started_at=0, ended_at=1, proposer="agent", description="", status="skip",
                        reason=reason)


@pytest.mark.parametrize("reason, cause", [
    ("agent exited with code 1: Not logged in · Please run /login", "auth"),
    ("agent exited with code 1: Invalid API key", "auth"),
    ("agent exited with code 1: API Error: 429 rate_limit_error", "quota"),
    ("agent exited with code 1: You have exceeded your quota", "quota"),
    ("agent could not start: command not found: claude", "missing binary"),
    ("agent timed out after 15m", "timeout"),
    ("agent made no change to train.py", "other"),
])
def test_a_proposer_failure_names_its_cause(reason, cause):
    assert failure_cause(reason) == cause


def test_three_failed_proposals_in_a_row_are_one_event_with_the_agent_cause():
    watch = EventWatch("t", [])
    events = [e for i in range(1, 5) for e in watch.recorded(skip("agent exited with code 1: Invalid API key", i))]
    assert [e.kind for e in events] == ["proposer_failures"]
    assert events[0].data["cause"] == "auth" and "(auth)" in events[0].title


def test_agent_text_is_made_safe_to_show():
    text = safe_text("fix\x1b[2J lr\n@here <!channel> \u202egnp.exe " + "x" * 400)
    assert "\x1b" not in text and "\n" not in text and "\u202e" not in text
    assert "@here" not in text and "<!channel>" not in text and len(text) == 300


# ------------------------------------------------------------------------------ doctor


def test_doctor_checks_each_url_and_hook_and_sends_only_when_asked(tmp_path, target, monkeypatch):
    # The two checks run_doctor adds at its end, in-process: the rest of doctor (torch, the
    # data, the agent) has its own tests and takes seconds.
    from autoloop.config.settings import Settings
    from autoloop.review.doctor import _hooks, _notify

    monkeypatch.setenv("NOTIFY_TOKEN", SECRET)
    settings = Settings(notify=[target.url, "bogus://x"],
                        hooks={"new_best": "no-such-command-here --flag", "night_end": "echo $AUTOLOOP_EVENT",
                               "low_disk": "if then"})
    notify = [c.line() for c in _notify(settings, send=False)]
    assert len(notify) == 2 and "its form is right" in notify[0] and SECRET not in " ".join(notify)
    assert notify[1].startswith("fail") and "bogus://" in notify[1]
    hooks = [c.line() for c in _hooks(tmp_path, settings)]
    assert hooks[0].startswith("warn") and "'no-such-command-here' is neither on PATH" in hooks[0]
    assert hooks[1].startswith("ok") and "--on night_end: echo" in hooks[1]
    assert hooks[2].startswith("warn") and "not a valid sh command" in hooks[2]
    assert target.posts == []   # nothing sent without --notify-test
    sent = [c.line() for c in _notify(Settings(notify=[target.url]), send=True)]
    assert len(sent) == 1 and "the test notification was delivered" in sent[0], sent
    assert [body["title"] for _, _, body in target.posts] == ["autoloop doctor"]
    assert {headers["X-Token"] for _, headers, _ in target.posts} == {SECRET}


def test_doctor_cli_takes_notify_test():
    from autoloop.cli.main import build_parser

    args = build_parser().parse_args(["doctor", "--notify", "ntfy://topic", "--notify-test", "--on", "night_end=true"])
    assert args.notify_test and args.notify == ["ntfy://topic"] and args.hooks == [("night_end", "true")]


def test_the_config_file_takes_notify_and_a_hooks_table_and_the_flags_add_to_it(tmp_path):
    from autoloop.config.loading import ConfigError, load_settings

    (tmp_path / "autoloop.toml").write_text(
        'notify = ["ntfy://night-${TOPIC}"]\nnotify-every = "5m"\nhook-timeout = "30s"\n\n'
        '[hooks]\nnight_end = "scripts/upload.sh"\nnew_best = "echo best"\n')
    settings = load_settings(tmp_path)
    assert settings.notify == ["ntfy://night-${TOPIC}"] and settings.notify_every == 300 and settings.hook_timeout == 30
    assert settings.hooks == {"night_end": "scripts/upload.sh", "new_best": "echo best"}
    settings = load_settings(tmp_path, {"hooks": {"new_best": "echo flag", "low_disk": "true"}})
    assert settings.hooks == {"night_end": "scripts/upload.sh", "new_best": "echo flag", "low_disk": "true"}
    (tmp_path / "autoloop.toml").write_text('[hooks]\nnew_worst = "true"\n')
    with pytest.raises(ConfigError, match="unknown event 'new_worst'"):
        load_settings(tmp_path)
