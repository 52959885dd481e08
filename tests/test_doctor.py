"""`autoloop doctor` through the real CLI, in a healthy repository and in broken ones."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers.git import TRAIN_PY, git, init_repo
from test_agent_presets import cli_env

LINE = re.compile(r"^(ok|warn|fail) +([\w .-]+?): (\S.*)$")


def doctor(repo: Path, tmp_path: Path, *args: str, clis: bool = True, **env: str) -> subprocess.CompletedProcess:
    import os

    full = {**os.environ, **cli_env(tmp_path, clis=clis, **env)}
    return subprocess.run([sys.executable, "-m", "autoloop.cli", "doctor", *args], cwd=repo, env=full,
                          capture_output=True, text=True, timeout=180, check=False)


def lines(proc) -> dict[str, tuple[str, str]]:
    """check name -> (status, detail); every line but the summary has the doctor's shape."""
    out = proc.stdout.splitlines()
    assert out and out[-1].startswith("doctor: "), proc.stdout + proc.stderr
    found = {}
    for line in out[:-1]:
        match = LINE.match(line)
        assert match, line
        status, name, detail = match.groups()
        found[name] = (status, detail)
    return found


def test_a_healthy_repository_is_ready(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    secret = "sk-ant-doctor-secret-42"
    proc = doctor(repo, tmp_path, "--agent", "claude", AUTOLOOP_DATA_DIR=str(tiny_data_dir),
                  ANTHROPIC_API_KEY=secret, IS_SANDBOX="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = lines(proc)
    assert {n for n, (s, _) in found.items() if s == "fail"} == set()
    for name in ("config", "git", "git identity", "clean tree", "train.py", "data", "torch", "disk",
                 "claude version", "claude auth", "plot", "slurm", "watch", "mcp", "isolate"):
        assert name in found, (name, proc.stdout)
    assert found["git identity"] == ("ok", "autoloop test <test@autoloop.invalid>")
    assert found["train.py"][1].startswith("parses; ") and "reports through autoloop.evaluate" in found["train.py"][1]
    assert found["data"] == ("ok", f"prepared in {tiny_data_dir} (stdlib, fingerprint "
                                   f"{found['data'][1].rsplit(' ', 1)[1]}")
    assert found["torch"][1].startswith("torch ")
    assert found["claude version"][1].startswith("2.1.197 (Claude Code) at ")
    assert found["claude auth"] == ("ok", "logged in (api_key from ANTHROPIC_API_KEY)")
    assert proc.stdout.splitlines()[-1].endswith(": ready for autoloop run")
    assert secret not in proc.stdout + proc.stderr


def test_no_git_identity_is_a_warning_naming_the_fallback(tmp_path, tiny_data_dir):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text("results/\n")
    (repo / "train.py").write_text(TRAIN_PY.read_text())
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=x", "-c", "user.email=x@y", "commit", "-q", "-m", "initial")
    proc = doctor(repo, tmp_path, AUTOLOOP_DATA_DIR=str(tiny_data_dir), GIT_CONFIG_GLOBAL=str(tmp_path / "none"),
                  GIT_CONFIG_NOSYSTEM="1")
    found = lines(proc)
    assert found["git identity"] == ("warn", "no user.name and user.email: trial commits are made as autoloop "
                                             "<autoloop@localhost>; set it with git config --global user.name ...")
    assert found["agent"][0] == "ok" and found["agent"][1].startswith("none configured")
    assert proc.returncode == 0, proc.stdout


def test_a_dirty_tree_a_broken_target_and_a_bad_config_fail(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    (repo / "train.py").write_text("def broken(:\n")
    (repo / "notes.txt").write_text("mine\n")
    (repo / "autoloop.toml").write_text("bugdet = 3\n")
    proc = doctor(repo, tmp_path, AUTOLOOP_DATA_DIR=str(tiny_data_dir))
    assert proc.returncode == 1
    found = lines(proc)
    assert found["config"] == ("fail", "autoloop.toml: unknown setting 'bugdet' (did you mean 'budget'?) (the checks "
                                       "below use the defaults)")
    assert found["clean tree"] == ("fail", "uncommitted changes: autoloop.toml, notes.txt, train.py; autoloop run "
                                           "needs a clean tree (commit or stash them)")
    assert found["train.py"][0] == "fail" and found["train.py"][1].startswith("does not parse: SyntaxError")
    assert proc.stdout.splitlines()[-1] == f"doctor: {sum(s == 'ok' for s, _ in found.values())} ok, " \
        f"{sum(s == 'warn' for s, _ in found.values())} warning" \
        f"{'' if sum(s == 'warn' for s, _ in found.values()) == 1 else 's'}, 3 failures"


def test_a_missing_or_unready_agent_fails(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    missing = doctor(repo, tmp_path, "--agent", "codex", clis=False, AUTOLOOP_DATA_DIR=str(tiny_data_dir))
    assert missing.returncode == 1
    assert lines(missing)["agent"] == ("fail", "agent command not found: codex (install it or use --agent-cmd)")
    logged_out = doctor(repo, tmp_path, "--agent", "codex", AUTOLOOP_DATA_DIR=str(tiny_data_dir))
    assert logged_out.returncode == 1
    found = lines(logged_out)
    assert found["codex version"][0] == "ok" and found["codex auth"][0] == "fail"
    assert found["codex auth"][1].startswith("not logged in (`codex login status`: Not logged in)")


def test_doctor_outside_a_repository(tmp_path, tiny_data_dir):
    folder = tmp_path / "plain"
    folder.mkdir()
    proc = doctor(folder, tmp_path, AUTOLOOP_DATA_DIR=str(tiny_data_dir))
    assert proc.returncode == 1
    found = lines(proc)
    assert found["git"][0] == "fail" and "autoloop init DIR makes an experiment repository" in found["git"][1]
    assert "Traceback" not in proc.stderr


def test_an_interrupted_worker_is_a_warning_and_run_flags_are_taken(tmp_path, tiny_data_dir):
    from autoloop.store.state import RunState, save_state

    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    save_state(repo / "results", RunState(tag="t", phase="running", trial=3, attempt=1), "state-w1.json")
    proc = doctor(repo, tmp_path, "--workers", "2", "--min-free-gb", "0", AUTOLOOP_DATA_DIR=str(tiny_data_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = lines(proc)
    assert found["last run"] == ("warn", "worker 1: trial 3.1 of tag 't' was interrupted (running); continue "
                                         "with autoloop run --resume")
    bad = doctor(repo, tmp_path, "--agent-stall-timeout", "-5", AUTOLOOP_DATA_DIR=str(tiny_data_dir))
    assert bad.returncode == 1
    assert lines(bad)["config"][0] == "fail" and "--agent-stall-timeout" in lines(bad)["config"][1]


# `nvidia-smi topo -m` of an 8-GPU NVLink node and of a 2-GPU PCIe box (columns shortened).
TOPO_NVLINK = "\t".join(["", *[f"GPU{j}" for j in range(8)], "CPU Affinity"]) + "\n" + "\n".join(
    "\t".join([f"GPU{i}", *["X" if i == j else "NV18" for j in range(8)], "0-55"]) for i in range(8))
TOPO_PCIE = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-15\nGPU1\tSYS\t X \t0-15\n\nLegend:\n  X    = Self\n"
FAKE_NVIDIA_SMI = f'''#!{sys.executable}
import sys
cap = ", 8.9" if "compute_cap" in " ".join(sys.argv) else ""
if sys.argv[1:3] == ["topo", "-m"]:
    print({TOPO_PCIE!r})
else:
    print(f"0, NVIDIA L40S, 46068 MiB{{cap}}")
    print(f"1, NVIDIA L40S, 46068 MiB{{cap}}")
'''
# One T4 (sm75); old_driver: a driver before 510, which refuses the compute_cap field.
def fake_t4_smi(old_driver: bool) -> str:
    return f'''#!{sys.executable}
import sys
if sys.argv[1:3] == ["topo", "-m"]:
    print("GPU0\\t X ")
elif "compute_cap" in " ".join(sys.argv):
    print("Field compute_cap is not a valid field") if {old_driver} else print("0, Tesla T4, 15360 MiB, 7.5")
    sys.exit(2 if {old_driver} else 0)
else:
    print("0, Tesla T4, 15360 MiB")
'''


def test_nvlink_summary_reads_the_topology_matrix():
    from autoloop.review.doctor import nvlink_summary

    assert nvlink_summary(TOPO_NVLINK) == "NVLink between all 8 GPUs (NV18)"
    assert nvlink_summary(TOPO_PCIE) == "no NVLink: the GPUs talk through SYS (PCIe/host)"
    assert nvlink_summary(TOPO_PCIE.strip()) == nvlink_summary(TOPO_PCIE)   # the header's tab stripped
    mixed = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\tSYS\nGPU1\tNV4\t X \tPHB\nGPU2\tSYS\tPHB\t X \n"
    assert nvlink_summary(mixed) == "NVLink between 1 of 3 GPU pairs, the others through PHB, SYS"
    assert nvlink_summary("\tGPU0\nGPU0\t X \n") == "one GPU: no links"
    assert nvlink_summary("") == "topology unknown (nvidia-smi topo -m said nothing)"


def test_doctor_shows_the_gpus_and_their_links_or_says_none(tmp_path, tiny_data_dir):
    import os

    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    bare = doctor(repo, tmp_path, AUTOLOOP_DATA_DIR=str(tiny_data_dir))   # its PATH has no nvidia-smi
    assert lines(bare)["gpus"] == ("ok", "none: no nvidia-smi on this machine")
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{cli_env(tmp_path)['PATH']}"
    found = lines(doctor(repo, tmp_path, AUTOLOOP_DATA_DIR=str(tiny_data_dir), PATH=path))
    assert found["gpus"] == ("ok", "0: NVIDIA L40S, 46068 MiB, sm89: trains in bf16; 1: NVIDIA L40S, 46068 MiB, "
                                   "sm89: trains in bf16; no NVLink: the GPUs talk through SYS (PCIe/host)")
    too_many = lines(doctor(repo, tmp_path, "--gpus-per-trial", "4", AUTOLOOP_DATA_DIR=str(tiny_data_dir), PATH=path))
    assert too_many["gpus"][0] == "fail" and too_many["gpus"][1].endswith("--gpus-per-trial 4 x --workers 1 needs 4")


def test_doctor_while_a_night_runs_says_so_and_advises_nothing_that_collides(tmp_path, tiny_data_dir):
    """A night in its trial: doctor names it (its pid, since when) instead of calling it
    interrupted and sending the person to --resume; once it ended, nothing is said of it."""
    import json
    import os
    import time

    from helpers.watch import cli_env as loop_env
    from helpers.watch import fake, fake_repo, queue, run_args

    repo = fake_repo(tmp_path)
    queue(repo, "01_hold.py", fake(A=0.5, HOLD=True), "held until results/go")
    loop = subprocess.Popen(run_args(), cwd=repo, env=loop_env(tiny_data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        state = repo / "results" / "state.json"
        deadline = time.time() + 120
        while time.time() < deadline and loop.poll() is None:
            text = state.read_text() if state.exists() else ""
            if '"phase": "running"' in text and '"trial": 1' in text:
                break
            time.sleep(0.1)
        st = json.loads(state.read_text())
        assert st["phase"] == "running" and st["trial"] == 1, loop.poll()
        proc = doctor(repo, tmp_path, "--min-free-gb", "0", AUTOLOOP_DATA_DIR=str(tiny_data_dir),
                      PATH=os.environ["PATH"])
        found = lines(proc)
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(st["run_started_at"]))
        assert found["night"] == ("ok", f"a night is running here: tag 't', pid {loop.pid}, since {since} (running); "
                                        "watch it with autoloop status or autoloop dashboard (the tree is its trial's)")
        assert "last run" not in found and "clean tree" not in found
        assert "--resume" not in proc.stdout and "stash" not in proc.stdout
    finally:
        (repo / "results" / "go").touch()
        out = loop.communicate(timeout=120)[0]
    assert loop.returncode == 0, out
    after = lines(doctor(repo, tmp_path, "--min-free-gb", "0", AUTOLOOP_DATA_DIR=str(tiny_data_dir)))
    assert "night" not in after and "last run" not in after and after["clean tree"][0] == "ok"


def test_a_torch_below_the_floor_is_refused_in_one_line_by_doctor_and_the_night(tmp_path, tiny_data_dir):
    """train.py needs torch 2.4 (F.rms_norm). AUTOLOOP_TORCH_VERSION (tests only) stands in for
    the installed version: doctor fails its torch line, and a night refuses to start."""
    repo = init_repo(tmp_path / "repo", {"train.py": TRAIN_PY.read_text()})
    floor = ("torch 2.3.1+cu121 is too old: train.py needs torch >= 2.4 (F.rms_norm); upgrade it with the CUDA "
             "build you have, e.g. pip install 'torch>=2.4' --index-url https://download.pytorch.org/whl/cu124")
    old = doctor(repo, tmp_path, AUTOLOOP_DATA_DIR=str(tiny_data_dir), AUTOLOOP_TORCH_VERSION="2.3.1+cu121")
    assert old.returncode != 0 and lines(old)["torch"] == ("fail", floor)
    import os
    night = subprocess.run([sys.executable, "-m", "autoloop.cli", "run", "--budget", "1", "--max-trials", "1"],
                           cwd=repo, env={**os.environ, **cli_env(tmp_path), "AUTOLOOP_DATA_DIR": str(tiny_data_dir),
                                          "AUTOLOOP_TORCH_VERSION": "2.3.1+cu121"},
                           capture_output=True, text=True, timeout=180)
    assert night.returncode != 0 and night.stderr.strip().splitlines()[-1] == f"autoloop: {floor}", night.stderr
    assert not (repo / "results" / "ledger.jsonl").exists()   # refused before anything started


def test_the_torch_floor_holds_for_train_py_alone(monkeypatch):
    """In-process: 2.4 and later pass, and a foreign --command's torch is its own business."""
    from autoloop.config.loading import build_settings
    from autoloop.core.torch_floor import refusal
    from autoloop.review.doctor import _torch

    assert refusal("2.4.0") is None and refusal("2.13.0+cpu") is None and refusal("3.0") is None
    assert refusal("2.2.2").startswith("torch 2.2.2 is too old") and refusal("1.13.1") is not None
    assert refusal("nightly") is None and refusal(None) is None   # unknown: not refused
    monkeypatch.setenv("AUTOLOOP_TORCH_VERSION", "2.3.1")
    assert _torch(build_settings({})).status == "fail"
    assert _torch(build_settings({"command": "python my_train.py"})).status == "ok"


def test_doctor_says_what_a_gpu_below_sm80_trains_in(tmp_path, monkeypatch):
    """A T4 (sm75) has no bf16 tensor cores: train.py trains in fp16 with a GradScaler there, and
    doctor says so from nvidia-smi's compute capability (a fake nvidia-smi on PATH; in-process,
    the CLI's line is test_doctor_shows_the_gpus_and_their_links_or_says_none's)."""
    import os

    from autoloop.config.loading import build_settings
    from autoloop.review.doctor import _gpus

    found = {}
    for old_driver in (False, True):
        bin_dir = tmp_path / f"smi-{old_driver}"
        bin_dir.mkdir()
        (bin_dir / "nvidia-smi").write_text(fake_t4_smi(old_driver))
        (bin_dir / "nvidia-smi").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        check = _gpus(build_settings({}))
        found[old_driver] = (check.status, check.detail)
    assert found[False] == ("ok", "0: Tesla T4, 15360 MiB, sm75: trains in fp16 with a GradScaler (no bf16 tensor "
                                  "cores below sm80); one GPU: no links")
    assert found[True] == ("ok", "0: Tesla T4, 15360 MiB; one GPU: no links")   # a driver before 510: no sm shown


def test_train_py_trains_in_fp16_with_a_scaler_below_sm80(monkeypatch):
    """train.py's choice, in-process: torch.cuda.get_device_capability is monkeypatched (no GPU
    here), and a torch.device("cuda") object needs none."""
    import torch
    from test_train import load_train_module

    train = load_train_module(monkeypatch)
    cuda = torch.device("cuda", 0)
    for capability, dtype in (((7, 5), torch.float16), ((7, 0), torch.float16), ((8, 0), torch.bfloat16),
                              ((9, 0), torch.bfloat16)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert train.half_dtype(cuda) == dtype, capability
    assert train.half_dtype(torch.device("cpu")) == torch.bfloat16   # the cuda profile's code paths on a CPU
