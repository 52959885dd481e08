"""`autoloop dashboard` over real HTTP: what it serves, and its access rules (loopback only
without a token; a token on every request otherwise, tried from a real non-loopback client in
a network namespace of the test's own), read-only, paths confined to results/."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from helpers.git import git
from helpers.night import build_night, realistic_steps
from helpers.watch import DashboardProcess

from autoloop.review.dashboard.server import (
    host_header_is_loopback,
    is_loopback_client,
    is_loopback_host,
    make_server,
    resolve_token,
)
from autoloop.review.dashboard.views import confined


def request(port: int, path: str, method: str = "GET", headers: dict | None = None,
            host: str = "127.0.0.1") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@pytest.fixture
def night(tmp_path):
    return build_night(tmp_path, realistic_steps(), tag="t")


def test_the_page_and_its_views(night):
    with DashboardProcess(night.repo) as dash:
        assert dash.url.startswith("http://127.0.0.1:") and "token" not in dash.url
        status, headers, body = request(dash.port, "/")
        assert status == 200 and b'<script src="app.js"' in body
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
        for path in ("/app.js", "/app.css"):
            assert request(dash.port, path)[0] == 200

        summary = json.loads(request(dash.port, "/api/summary")[2])
        assert summary["tag"] == "t" and summary["best"]["commit"] == night.best
        assert summary["records"] == len(night.records) and summary["direction"] == "min"

        rows = json.loads(request(dash.port, "/api/attempts?start=0")[2])
        assert rows["total"] == len(night.records)
        assert [(r["trial"], r["attempt"], r["status"], r["description"]) for r in rows["rows"]] == \
            [(r.trial, r.attempt, r.status, r.description) for r in night.records]
        tail = json.loads(request(dash.port, f"/api/attempts?start={len(night.records) - 2}")[2])
        assert [r["index"] for r in tail["rows"]] == [len(night.records) - 2, len(night.records) - 1]

        kept = next(r for r in night.records if r.status == "keep" and r.kind != "baseline")
        (night.results / "runs" / f"{kept.trial}-{kept.attempt}.log").write_text("step 1 | loss: 2.0\nthe end\n")
        detail = json.loads(request(dash.port, f"/api/attempt?trial={kept.trial}&attempt={kept.attempt}")[2])
        assert detail["diff"] == subprocess.run(["git", "diff", kept.parent, kept.commit], cwd=night.repo,
                                                capture_output=True, text=True).stdout
        assert detail["log"]["text"] == "step 1 | loss: 2.0\nthe end"

        assert json.loads(request(dash.port, "/api/live")[2])["attempts"] == []   # the night is over
        status, _, body = request(dash.port, "/api/attempt?trial=999&attempt=1")
        assert status == 404 and body == b"no attempt 999.1 in the ledger\n"
        assert request(dash.port, "/api/attempt?trial=x")[0] == 404


def test_read_only_and_nothing_but_its_own_files(night):
    before = git(night.repo, "status", "--porcelain", "--ignored")
    with DashboardProcess(night.repo) as dash:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, headers, _ = request(dash.port, "/api/summary", method=method)
            assert status == 405 and headers["allow"] == "GET, HEAD"
        for path in ("/../../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/results/ledger.jsonl",
                     "/static/../../pyproject.toml", "/train.py", "//etc/passwd"):
            status, _, body = request(dash.port, path)
            assert status == 404 and b"root:" not in body, path
    assert git(night.repo, "status", "--porcelain", "--ignored") == before


def test_a_log_path_outside_the_workspace_is_refused(night, tmp_path):
    """The ledger is the only source of paths; a hand-edited one naming a file outside
    results/ (directly, or through a symlink) gets no byte of it."""
    from autoloop.store.ledger import Ledger, LedgerRecord

    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n")
    (night.results / "runs" / "link.log").symlink_to(secret)
    ledger = Ledger(night.results, fsync=False)
    base = night.records[0]
    for trial, log_path in ((900, "../../secret.txt"), (901, "runs/link.log"), (902, str(secret))):
        ledger.append(LedgerRecord(trial=trial, started_at=base.ended_at + trial, ended_at=base.ended_at + trial + 1,
                                   proposer="queue", parent=night.best, commit=night.best, description="x",
                                   status="discard", metric=1.1, log_path=log_path, best=night.best,
                                   best_metric=base.best_metric))
    with DashboardProcess(night.repo) as dash:
        for trial in (900, 901, 902):
            status, _, body = request(dash.port, f"/api/attempt?trial={trial}&attempt=1")
            assert status == 200 and b"TOP SECRET" not in body
            assert json.loads(body)["log"]["error"].startswith("refused: ")
    assert confined(night.results, "runs/0-1.log") == (night.results / "runs" / "0-1.log").resolve()
    assert confined(night.results, "../x") is None and confined(night.results, "/etc/passwd") is None


def test_loopback_rules(night):
    with DashboardProcess(night.repo) as dash:
        assert request(dash.port, "/api/summary", headers={"Host": f"localhost:{dash.port}"})[0] == 200
        # A page elsewhere reaching the dashboard through DNS rebinding sends its own Host.
        status, _, body = request(dash.port, "/api/summary", headers={"Host": f"attacker.example:{dash.port}"})
        assert status == 403 and b"Host" in body
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1") and is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("192.168.1.5")
    assert is_loopback_client("127.0.0.5") and is_loopback_client("::ffff:127.0.0.1")
    assert not is_loopback_client("192.0.2.2") and not is_loopback_client("::ffff:10.0.0.1")
    assert host_header_is_loopback("[::1]:8765") and not host_header_is_loopback("127.0.0.1.evil.example")
    assert not host_header_is_loopback(None)


def test_a_token_on_every_request_off_loopback(night):
    with DashboardProcess(night.repo, "--host", "0.0.0.0") as dash:
        assert all("/?token=" in url for url in dash.urls)
        assert "the token is checked on every request" in "\n".join(dash.lines)
        token = dash.url.split("token=", 1)[1]
        for path in ("/", "/app.js", "/api/summary", "/api/attempts"):
            status, _, body = request(dash.port, path)
            assert status == 401 and b"token required" in body, path
        assert request(dash.port, "/api/summary?token=" + "x" * len(token))[0] == 401
        assert request(dash.port, "/api/summary", headers={"Authorization": "Bearer nope"})[0] == 401
        assert request(dash.port, "/api/summary", headers={"Authorization": f"Bearer {token}"})[0] == 200
        status, headers, _ = request(dash.port, f"/?token={token}")
        assert status == 200
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"autoloop_token_{dash.port}={token};") and "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        name_value = cookie.split(";", 1)[0]
        assert request(dash.port, "/api/summary", headers={"Cookie": name_value})[0] == 200
        assert request(dash.port, "/api/summary", headers={"Cookie": f"autoloop_token_{dash.port}=wrong"})[0] == 401


def test_bad_dashboard_settings_are_one_line_errors(night, tmp_path):
    env = {**os.environ, "AUTOLOOP_DASHBOARD_TOKEN": "short"}
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "dashboard", "--host", "0.0.0.0", "--port", "0"],
                          cwd=night.repo, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("autoloop: AUTOLOOP_DASHBOARD_TOKEN: must be at least")
    with DashboardProcess(night.repo) as dash:
        proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "dashboard", "--port", str(dash.port)],
                              cwd=night.repo, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1
        assert proc.stderr == (f"autoloop: port {dash.port} is in use on 127.0.0.1 "
                               "(pick another with --port, or 0 for any)\n")
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "dashboard", "--port", "70000"], cwd=night.repo,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected a port from 0 to 65535" in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    proc = subprocess.run([sys.executable, "-m", "autoloop.cli", "dashboard", "--port", "0"], cwd=empty,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("autoloop: no results/ in ") and proc.stderr.count("\n") == 1
    assert resolve_token("127.0.0.1") is None and len(resolve_token("0.0.0.0", {})) >= 32


# ------------------------------------------------------------------------------ a real remote client


class Namespace:
    """A network namespace of this test's own joined to this one by a veth pair: the host side
    is 198.18.77.1, the namespace 198.18.77.2 (a /30 of the benchmarking range, RFC 2544, on
    the veth pair alone: nothing outside the machine is ever addressed). A request made from
    inside comes from a real non-loopback address."""

    HOST, GUEST = "198.18.77.1", "198.18.77.2"

    def __init__(self, name: str):
        self.name = name
        taken = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        if "198.18.77." in taken:
            raise RuntimeError("198.18.77.0/30 is in use on this machine")
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", "300"])
        pid = str(self.holder.pid)
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.time() + 10
        while time.time() < deadline:   # until unshare has entered its namespace (then execs sleep)
            try:
                if os.readlink(f"/proc/{pid}/ns/net") != ours:
                    break
            except OSError:
                pass
            time.sleep(0.02)
        steps = [["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p", "netns", pid],
                 ["ip", "addr", "add", f"{self.HOST}/30", "dev", name], ["ip", "link", "set", name, "up"],
                 ["nsenter", "-t", pid, "-n", "ip", "addr", "add", f"{self.GUEST}/30", "dev", name + "p"],
                 ["nsenter", "-t", pid, "-n", "ip", "link", "set", name + "p", "up"]]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True)
            if proc.returncode != 0:
                self.close()
                raise RuntimeError(f"{' '.join(step)}: {proc.stderr.strip()}")

    def get(self, url: str, headers: dict | None = None) -> int:
        """The HTTP status of a GET made from inside the namespace (-1: no connection)."""
        code = ("import sys, urllib.request, urllib.error\n"
                f"req = urllib.request.Request({url!r}, headers={headers or {}!r})\n"
                "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
                "try:\n    print(opener.open(req, timeout=10).status)\n"
                "except urllib.error.HTTPError as e:\n    print(e.code)\n"
                "except OSError:\n    print(-1)\n")
        proc = subprocess.run(["nsenter", "-t", str(self.holder.pid), "-n", sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=60)
        return int(proc.stdout.strip())

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.name], capture_output=True)
        self.holder.kill()
        self.holder.wait()


# Every namespace uses the same /30, so two at once collide and the second test skips ("in use
# on this machine": seen in one CI run, its two tests on the two xdist workers at once). The tests
# that take one share an xdist group, which loadgroup runs on one worker, one after another.
ONE_NAMESPACE_AT_A_TIME = pytest.mark.xdist_group("network_namespace")


@pytest.fixture
def namespace():
    if sys.platform != "linux" or os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("unshare")
                                                               and shutil.which("nsenter")):
        pytest.skip("needs root and iproute2/util-linux to make a network namespace with a veth pair")
    try:
        ns = Namespace(f"alt{os.getpid() % 100000}")
    except RuntimeError as e:
        pytest.skip(f"cannot make a network namespace here: {e}")
    yield ns
    ns.close()


@ONE_NAMESPACE_AT_A_TIME
def test_remote_clients_need_the_token_and_loopback_is_not_reachable(night, namespace):
    with DashboardProcess(night.repo, "--host", "0.0.0.0") as dash:
        token = dash.url.split("token=", 1)[1]
        base = f"http://{namespace.HOST}:{dash.port}"
        assert namespace.get(f"{base}/api/summary") == 401
        assert namespace.get(f"{base}/api/summary?token=wrong-token-0123456789") == 401
        assert namespace.get(f"{base}/api/summary?token={token}") == 200
        assert namespace.get(f"{base}/api/summary", {"Authorization": f"Bearer {token}"}) == 200
    with DashboardProcess(night.repo) as dash:   # the default: bound to loopback, out of reach
        assert namespace.get(f"http://{namespace.HOST}:{dash.port}/api/summary") == -1


@ONE_NAMESPACE_AT_A_TIME
def test_without_a_token_only_loopback_clients_are_served(night, namespace):
    """The rule behind the default, on a server listening everywhere with no token (the CLI
    never starts one like that): a real request from a non-loopback address is refused."""
    server = make_server(night.repo, "0.0.0.0", 0, token=None)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert namespace.get(f"http://{namespace.HOST}:{port}/api/summary") == 403
        assert request(port, "/api/summary")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_live_view_of_parallel_workers(night):
    """Each worker's attempt in flight, with the tail of its own log."""
    import json as _json

    from autoloop.review.dashboard.views import WorkspaceViews

    results = night.results
    state = _json.loads((results / "state.json").read_text())
    (results / "state.json").write_text(_json.dumps({**state, "phase": "idle", "workers": 2, "pid": os.getpid()}))
    (results / "state-w1.json").write_text(_json.dumps({
        "tag": "t", "phase": "running", "trial": 31, "attempt": 1, "kind": "candidate", "description": "<i>w1</i>",
        "attempt_started_at": time.time() - 5, "progress": "step 00010 (40.0%) | loss: 2.5000"}))
    (results / "runs" / "31-1.log").write_text("".join(f"line {i}\n" for i in range(500)))
    live = WorkspaceViews(night.repo).live()
    [attempt] = live["attempts"]
    assert attempt["worker"] == "w1" and attempt["label"] == "31" and attempt["description"] == "<i>w1</i>"
    assert attempt["percent"] == 40.0 and attempt["loss"] == 2.5
    assert attempt["log"]["text"].splitlines()[-1] == "line 499" and len(attempt["log"]["text"].splitlines()) == 80
    assert 4 < live["now"] - attempt["attempt_started_at"] < 120


def test_live_view_shows_the_look_ahead_proposal_and_the_prepared_candidates(night):
    """#16: while trial n trains, the proposal of n+1 is in flight in its own state file,
    and a candidate prepared earlier waits in results/prepared/: both are in the live view."""
    import json as _json

    from autoloop.review.dashboard.views import WorkspaceViews

    results = night.results
    state = _json.loads((results / "state.json").read_text())
    (results / "state.json").write_text(_json.dumps({
        **state, "phase": "running", "trial": 40, "attempt": 1, "kind": "candidate", "description": "n",
        "attempt_started_at": time.time() - 30, "pid": os.getpid()}))
    (results / "state-ahead.json").write_text(_json.dumps({
        "tag": "t", "phase": "proposing", "trial": 41, "attempt": 1, "kind": "candidate", "proposer": "agent",
        "attempt_started_at": time.time() - 5}))
    (results / "prepared").mkdir(exist_ok=True)
    (results / "prepared" / "39.json").write_text("{}")
    live = WorkspaceViews(night.repo).live()
    running, ahead = live["attempts"]
    assert running["label"] == "40" and not running.get("lookahead")
    assert ahead["label"] == "41" and ahead["lookahead"] is True and ahead["kind"] == "look-ahead"
    assert ahead["phase"] == "proposing" and ahead["proposer"] == "agent" and ahead["log"] is None
    assert live["prepared"] == [39]
    # An idle look-ahead (its proposal saved) is not shown as in flight.
    (results / "state-ahead.json").write_text(_json.dumps({"tag": "t", "phase": "idle"}))
    assert [a["label"] for a in WorkspaceViews(night.repo).live()["attempts"]] == ["40"]


def test_a_diverged_number_goes_out_as_null(night):
    from autoloop.store.ledger import Ledger, LedgerRecord

    base = night.records[-1]
    Ledger(night.results, fsync=False).append(LedgerRecord(
        trial=950, started_at=base.ended_at + 1, ended_at=base.ended_at + 2, proposer="queue", parent=night.best,
        commit=night.best, description="diverged", status="discard", metric=float("nan"), noise=float("inf"),
        best=night.best, best_metric=base.best_metric))
    with DashboardProcess(night.repo) as dash:
        status, _, body = request(dash.port, f"/api/attempts?start={len(night.records)}")
        assert status == 200
        [row] = json.loads(body)["rows"]          # strict JSON: no NaN, no Infinity
        assert row["metric"] is None and row["noise"] is None and row["delta"] is None
