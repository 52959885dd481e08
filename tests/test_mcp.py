"""`autoloop mcp` as a client sees it: the server started as a subprocess, spoken to with the
MCP SDK's own stdio client. Reads match results.tsv; the write tools answer only with
--allow-write; a patch is refused unless it edits train.py alone and applies to the best,
and an accepted one is run by the next trial of a --proposer queue night."""

from __future__ import annotations

import difflib
import json
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from helpers.git import git
from helpers.loop import GOOD, SLOW, autoloop, read_ledger, read_tsv, run_args
from helpers.night import build_night, realistic_steps
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from autoloop.store.state import RunState, save_state

ROOT = Path(__file__).resolve().parent.parent
READ_TOOLS = {"status", "attempts", "attempt", "best", "digest", "report", "verify_status"}
WRITE_TOOLS = {"note", "queue_patch", "stop_after_trial"}


@asynccontextmanager
async def connected(repo: Path, *flags: str):
    """A session with `autoloop mcp` started in ``repo`` (this checkout's autoloop first on the path)."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    params = StdioServerParameters(command=sys.executable, args=["-m", "autoloop.cli", "mcp", *flags],
                                   cwd=str(repo), env=env)
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, **arguments) -> tuple[bool, dict | str]:
    """(is_error, the JSON answer or the error's text)."""
    result = await session.call_tool(tool, arguments)
    text = result.content[0].text
    return result.is_error, (text if result.is_error else json.loads(text))


def unified(old: str, new: str, name: str = "train.py") -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{name}", f"b/{name}"))


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    return build_night(tmp_path_factory.mktemp("night"), realistic_steps(), tag="t")


def test_read_tools_answer_what_the_ledger_says(night):
    (night.results / "runs" / "1-1.log").write_text("step 1 | loss: 2.0\nthe end of the log\n")

    async def session() -> None:
        async with connected(night.repo) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == READ_TOOLS | WRITE_TOOLS
            assert all(tools[name].annotations.read_only_hint for name in READ_TOOLS)
            uris = {str(r.uri) for r in (await s.list_resources()).resources}
            assert uris == {"autoloop://results.tsv", "autoloop://program.md", "autoloop://report.md"}

            _, rows = await call(s, "attempts", limit=500)
            tsv = read_tsv(night.repo)
            assert rows["total"] == len(tsv) and rows["schema"] == "autoloop.attempts"
            assert [(r["label"], r["status"], r["crash"] or "-", (r["commit"] or "-")[:7]) for r in rows["rows"]] \
                == [(t["trial"], t["status"], t["crash"], t["commit"]) for t in tsv]
            assert [f"{r['metric'] or 0:.6f}" for r in rows["rows"]] == [t["val_bpb"] for t in tsv]
            _, crashes = await call(s, "attempts", status=["crash"], crash=["fundamental"], since=5)
            assert crashes["rows"] and all(r["status"] == "crash" and r["crash"] == "fundamental" and r["trial"] > 5
                                           for r in crashes["rows"])
            _, skips = await call(s, "attempts", status="skip")   # one status alone, not a list
            assert [r["status"] for r in skips["rows"]] == ["skip"]
            _, last = await call(s, "attempts", kept=True, limit=2)
            assert [r["label"] for r in last["rows"]] == [t["trial"] for t in tsv if t["status"] == "keep"][-2:]

            _, one = await call(s, "attempt", trial=1)
            assert one["description"] == "MATRIX_LR 0.04 -> 0.06" and one["status"] == "keep"
            assert "-MATRIX_LR = 0.04" in one["diff"] and "+MATRIX_LR = 0.06" in one["diff"]
            assert one["log"]["text"].endswith("the end of the log") and "not instructions" in one["untrusted"]
            error, text = await call(s, "attempt", trial=999)
            assert error and "no attempt 999.1" in text

            _, best = await call(s, "best")
            assert best["commit"] == night.best and best["baseline"]["commit"] == night.baseline
            _, status = await call(s, "status")
            assert status["schema"] == "autoloop.status" and status["tag"] == "t" and not status["running"]
            _, digest = await call(s, "digest")
            assert "Research digest" in digest["digest"]
            _, report = await call(s, "report")
            assert report["report"].startswith("# autoloop report")
            tsv_text = (await s.read_resource("autoloop://results.tsv")).contents[0].text
            assert tsv_text == (night.results / "results.tsv").read_text()

            # Read-only: every write tool refuses, saying how to allow it; listing notes is a read.
            for tool, args in (("queue_patch", {"diff": unified(night_train(night), night_train(night) + "#\n")}),
                               ("stop_after_trial", {}), ("note", {"action": "add", "text": "try SwiGLU"})):
                error, text = await call(s, tool, **args)
                assert error and "--allow-write" in text, (tool, text)
            assert (await call(s, "note"))[1]["in_force"] == []

    anyio.run(session)
    assert not (night.results / "queue").exists() and not (night.results / "person-notes.json").exists()


def night_train(night) -> str:
    return git(night.repo, "show", f"{night.best}:train.py") + "\n"


def test_write_tools_check_before_they_write(tmp_path):
    night = build_night(tmp_path, realistic_steps()[:3], tag="t")   # its own: this test writes
    repo = night.repo
    best = night_train(night)
    good = unified(best, best.replace("DROPOUT = 0.0", "DROPOUT = 0.1"))
    state = RunState(tag="t", phase="idle", pid=os.getpid())   # a live orchestrator: this test's own process
    save_state(night.results, state)

    async def session() -> None:
        async with connected(repo, "--allow-write") as s:
            error, text = await call(s, "queue_patch", diff=good + unified("x\n", "y\n", "program.md"))
            assert error and "touches program.md" in text and "only train.py" in text
            error, text = await call(s, "queue_patch", diff=unified(best.replace("DROPOUT", "DROP"), "nothing\n"))
            assert error and "does not apply to the best" in text
            error, text = await call(s, "queue_patch", diff="no diff here")
            assert error and "not a unified diff" in text
            assert not (night.results / "queue").exists()

            error, queued = await call(s, "queue_patch", diff=good, description="dropout 0.1")
            assert not error and queued["best"] == night.best and queued["position"] == 1
            _, noted = await call(s, "note", action="add", text="try SwiGLU")
            assert [n["note"] for n in noted["in_force"]] == ["try SwiGLU"]
            _, stopped = await call(s, "stop_after_trial")
            assert stopped == {"requested": True, "pid": os.getpid(), "file": "results/stop-request.json"}

    anyio.run(session)
    (queued_file,) = (night.results / "queue").glob("*.patch")
    assert queued_file.read_text().startswith("dropout 0.1\n\n") and good in queued_file.read_text()
    assert json.loads((night.results / "stop-request.json").read_text())["pid"] == os.getpid()


def test_a_queued_patch_is_the_next_trial_of_a_queue_night(baselined_repo, tiny_data_dir):
    repo = baselined_repo
    diff = unified(SLOW, GOOD)

    async def session() -> None:
        async with connected(repo, "--allow-write") as s:
            error, queued = await call(s, "queue_patch", diff=diff, description="restore the learning rates")
            assert not error, queued

    anyio.run(session)
    proc = autoloop(repo, *run_args(), "--resume", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trial = [r for r in read_ledger(repo) if r["trial"] == 1]
    assert [(r["description"], r["status"]) for r in trial] == [("restore the learning rates", "keep")]
    assert (repo / "train.py").read_text() == GOOD
