"""`autoloop doctor`'s checks: is this repository and this machine ready for a night?

Each check prints one line, ``ok``, ``warn`` or ``fail``, as soon as it is done (importing
torch takes seconds): git and its identity, a clean tree, the target's contract, the data,
torch and the device, free disk, the configured agent (its preflight, proposers/preflight.py),
the optional extras, ``--isolate``, each ``--notify`` URL's form and each ``--on`` hook's
command. ``fail`` means ``autoloop run`` would stop on it (or
not get far); ``warn`` means it works, but you may want to know. Every check is local and
takes at most seconds; none trains, none reaches the network (but ``--notify-test``, which
sends one notification to each URL). The command
(``cli/commands/doctor.py``) reads the flags, prints and sets the exit status.
"""

from __future__ import annotations

import ast
import glob
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from autoloop.config.settings import Settings
from autoloop.core import torch_floor
from autoloop.core.checks import Check, fail, failures, ok, warn
from autoloop.observe.console import plural

if TYPE_CHECKING:
    from autoloop.repo.workspace import Workspace


def run_doctor(root: Path, load: Callable[[], Settings], say: Callable[[str], None],
               notify_test: bool = False) -> list[Check]:
    """Every check, each said as one line when done; returns them (a fail: exit non-zero).

    ``load`` gives the Settings (config file and flags); a ConfigError is itself a failed
    check, and the rest is checked with the defaults.
    """
    from autoloop.config.loading import ConfigError

    checks: list[Check] = []

    def record(found: Check | list[Check]) -> None:
        for check in found if isinstance(found, list) else [found]:
            checks.append(check)
            say(check.line())

    try:
        settings = load()
        record(ok("config", f"settings from {settings.source}" if settings.source else
                  "defaults (no autoloop.toml or [tool.autoloop] in pyproject.toml)"))
    except ConfigError as e:
        record(fail("config", f"{e} (the checks below use the defaults)"))
        settings = Settings()
    for step in _steps(root, settings):
        record(step())
    record(_notify(settings, notify_test))
    record(_hooks(root, settings))
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
    say(f"doctor: {counts['ok']} ok, {plural(counts['warn'], 'warning')}, {plural(counts['fail'], 'failure')}"
        + ("" if failures(checks) else ": ready for autoloop run"))
    return checks


def _steps(root: Path, settings: Settings) -> Iterator[Callable[[], Check | list[Check]]]:
    ws = _workspace(root, settings)
    yield lambda: _git(root, ws)
    if not isinstance(ws, Check):
        yield lambda: _identity(root)
        night = _running(ws.results_dir)
        if night is not None:
            # The tree and the state files are the running night's: a dirty tree is its trial,
            # an attempt in flight is not interrupted, and nothing is to be resumed or stashed.
            yield lambda: night
        else:
            yield lambda: _clean_tree(ws)
            yield lambda: _interrupted(ws.results_dir)
    yield lambda: _target(root, settings)
    yield lambda: _data(settings)
    yield lambda: _torch(settings)
    yield lambda: _gpus(settings)
    yield lambda: _disk(root, settings)
    yield lambda: _agent(root, settings)
    yield lambda: _extras(root, settings)
    yield lambda: _isolation(settings)


# ------------------------------------------------------------------------------ git


def _workspace(root: Path, settings: Settings) -> Workspace | Check:
    from autoloop.repo.workspace import Workspace, WorkspaceError

    try:
        return Workspace(root, settings.target)
    except WorkspaceError as e:
        return fail("git", f"{e} (autoloop init DIR makes an experiment repository)")


def _git(root: Path, ws: Workspace | Check) -> Check:
    if isinstance(ws, Check):
        return ws
    version = _output(["git", "--version"], root) or "git"
    return ok("git", f"{version}; repository {ws.root}")


def _identity(root: Path) -> Check:
    name = _output(["git", "config", "user.name"], root)
    email = _output(["git", "config", "user.email"], root)
    if name and email:
        return ok("git identity", f"{name} <{email}>")
    from autoloop.repo.workspace import FALLBACK_EMAIL, FALLBACK_NAME

    missing = " and ".join(k for k, v in (("user.name", name), ("user.email", email)) if not v)
    return warn("git identity", f"no {missing}: trial commits are made as {FALLBACK_NAME} <{FALLBACK_EMAIL}>; "
                                f"set it with git config --global {missing.split(' and ')[0]} ...")


def _clean_tree(ws: Workspace) -> list[Check]:
    from autoloop.repo.workspace import WorkspaceError, _listing

    checks = []
    try:
        ws.ensure_results_ignored()
    except WorkspaceError as e:
        checks.append(fail("results folder", str(e)))
    dirty = ws.dirty_paths()
    if dirty:
        checks.append(fail("clean tree", f"uncommitted changes: {_listing(dirty)}; autoloop run needs a clean "
                                         f"tree (commit or stash them)"))
    else:
        checks.append(ok("clean tree", f"nothing uncommitted on {ws.current_branch() or 'a detached HEAD'}"))
    return checks


def _running(results_dir: Path) -> Check | None:
    """A night running here now (review/running.py): said, with what is safe to do meanwhile."""
    import time

    from autoloop.review.running import running_night

    night = running_night(results_dir)
    if night is None:
        return None
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(night.since)) if night.since else "an unknown time"
    tag = f" tag '{night.tag}'," if night.tag else ""
    return ok("night", f"a night is running here:{tag} pid {night.pid}, since {since} ({night.phase}); "
                       "watch it with autoloop status or autoloop dashboard (the tree is its trial's)")


def _interrupted(results_dir: Path) -> list[Check]:
    from autoloop.core.layout import Layout
    from autoloop.engine.recovery import interrupted, interrupted_lookahead

    # The single loop's state file, every worker's and every look-ahead's (recovery.py
    # finishes them all).
    layout = Layout(results_dir)
    found = [("" if worker is None else f"worker {worker}: ", state) for worker, state in interrupted(layout)]
    found += [(f"{'' if worker is None else f'worker {worker} '}look-ahead: ", state)
              for worker, state in interrupted_lookahead(layout)]
    return [warn("last run", f"{who}trial {state.trial}.{state.attempt} of tag '{state.tag}' was interrupted "
                             f"({state.phase}); continue with autoloop run --resume")
            for who, state in found]


# ------------------------------------------------------------------------------ the experiment


def _target(root: Path, settings: Settings) -> Check:
    from autoloop.proposers.mutate import MutateError, constant_moves, find_constants

    name = settings.target
    path = root / name
    try:
        source = path.read_bytes()
    except OSError as e:
        return fail(name, f"cannot read it ({e.strerror or e})")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as e:
        return fail(name, f"does not parse: {type(e).__name__}: {e}")
    try:
        tunable = [c.name for c in find_constants(source) if constant_moves(c)]
    except MutateError as e:
        return fail(name, f"its constants cannot be read: {e}")
    uses_evaluate = any(
        (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("autoloop"))
        or (isinstance(n, ast.Import) and any(a.name.startswith("autoloop") for a in n.names))
        for n in ast.walk(tree))
    constants = f"{plural(len(tunable), 'constant')} the mutator can tune"
    if settings.command is None and not uses_evaluate:
        return warn(name, f"parses, {constants}, but never imports autoloop: under the default command a run "
                          f"without autoloop.evaluate's result file is a crash")
    if not tunable:
        return warn(name, "parses, but has no UPPER_CASE constants the mutator could tune (an agent or a queue "
                          "still works)")
    return ok(name, f"parses; {constants}" + ("; reports through autoloop.evaluate" if uses_evaluate else ""))


def _data(settings: Settings) -> Check:
    from autoloop.data import CorpusSpec, DataError, default_data_dir, read_meta

    spec = CorpusSpec(source=settings.corpus)
    where = Path(settings.data_dir) if settings.data_dir else default_data_dir(spec)
    try:
        meta = read_meta(where)
    except DataError as e:
        return fail("data", str(e))
    if meta is not None:
        return ok("data", f"prepared in {where} ({meta.get('source')}, fingerprint {meta.get('fingerprint')})")
    if spec.is_stdlib:
        return ok("data", f"not prepared yet: built from this Python's standard library on first use, into {where}")
    if spec.hub is not None:
        return ok("data", f"not prepared yet: `autoloop prepare --corpus {spec.source}` downloads it into {where} "
                          "(or the night's start does)")
    source = os.path.expanduser(settings.corpus)
    if os.path.exists(source) or glob.glob(source):
        return ok("data", f"not prepared yet: built from {settings.corpus} on first use, into {where}")
    return fail("data", f"corpus {settings.corpus} not found (a directory, file or glob of text)")


def _torch(settings: Settings) -> Check:
    try:
        import torch
    except Exception as e:  # a broken install raises anything
        return fail("torch", f"cannot import torch: {type(e).__name__}: {e}")
    version = os.environ.get(torch_floor.VERSION_VAR) or torch.__version__
    build = f"torch {version}" + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (CPU build)")
    too_old = torch_floor.refusal(version) if settings.command is None else None   # the default train.py's floor
    if too_old:
        return fail("torch", too_old)
    wanted = settings.device
    if torch.cuda.is_available():
        gpus = []
        for i in range(torch.cuda.device_count()):
            try:
                free, total = torch.cuda.mem_get_info(i)
                memory = f", {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"
            except RuntimeError:
                memory = ""
            gpus.append(f"cuda:{i} {torch.cuda.get_device_name(i)}{memory}")
        return ok("torch", f"{build}; {'; '.join(gpus)}")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        if wanted and wanted.startswith("cuda"):
            return fail("torch", f"{build}; --device {wanted}, but only MPS is available")
        return ok("torch", f"{build}; Apple MPS")
    if wanted and wanted != "cpu":
        return fail("torch", f"{build}; --device {wanted}, but torch sees no {wanted.split(':')[0].upper()} device")
    return ok("torch", f"{build}; no GPU: trials train on the CPU ({plural(os.cpu_count() or 1, 'core')})")


def _disk(root: Path, settings: Settings) -> Check:
    from autoloop.core.layout import Layout
    from autoloop.data import CorpusSpec, default_data_dir
    from autoloop.execution.diskspace import _existing, low_disk_reason

    data = Path(settings.data_dir) if settings.data_dir else default_data_dir(CorpusSpec(source=settings.corpus))
    paths = [Layout.of(root).root, root, data]
    low = low_disk_reason([*paths], settings.min_free_gb)   # a new list: it takes list[Path | None]
    if low:
        return fail("disk", f"{low}: autoloop run would stop before its first trial")
    seen, parts = set(), []
    for path in paths:
        where = _existing(path)
        try:
            device, free = where.stat().st_dev, shutil.disk_usage(where).free
        except OSError:
            continue
        if device not in seen:
            seen.add(device)
            parts.append(f"{free / 2**30:.1f} GB free on {where}")
    return ok("disk", "; ".join(parts) or "free space not measurable")


# ------------------------------------------------------------------------------ agent and extras


def _agent(root: Path, settings: Settings) -> Check | list[Check]:
    from autoloop.proposers.preflight import agent_checks

    if not (settings.agent or settings.agent_cmd):
        return ok("agent", "none configured (--agent, --agent-cmd or agent = ... in autoloop.toml); autoloop run "
                           "uses the queue or the mutator")
    return agent_checks(settings, root)


def _extras(root: Path, settings: Settings) -> list[Check]:
    checks = []
    plot = _installed("matplotlib")
    checks.append(ok("plot", f"matplotlib {plot}: autoloop report draws progress.png") if plot else
                  warn("plot", "matplotlib is not installed: autoloop report writes no progress.png "
                               "(pip install 'autoloop[plot]')"))
    submitit = _installed("submitit")
    if settings.executor == "slurm":
        if not submitit:
            checks.append(fail("slurm", "--executor slurm needs submitit: pip install 'autoloop[slurm]'"))
        elif settings.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
            checks.append(fail("slurm", f"submitit {submitit}, but sbatch is not on PATH (run the loop on a "
                                        f"login node, or --slurm-cluster local to try it here)"))
        else:
            checks.append(ok("slurm", f"submitit {submitit}"))
            if settings.slurm_cluster == "slurm":
                checks.append(_sbatch_test_only(root, settings))
    else:
        checks.append(ok("slurm", f"submitit {submitit}" if submitit else
                         "submitit not installed (needed only for --executor slurm: pip install 'autoloop[slurm]')"))
    checks.extend(_ray(settings))
    # The viewers' extras: never needed by a night, so never more than a line saying how to add them.
    for name, module, what in (("watch", "rich", "autoloop watch"), ("mcp", "mcp", "autoloop mcp")):
        version = _installed(module)
        checks.append(ok(name, f"{module} {version}: {what} works" if version else
                         f"{module} not installed (needed only for {what}: pip install 'autoloop[{name}]')"))
    return checks


def _ray(settings: Settings) -> list[Check]:
    """--executor ray: the cluster reachable, its nodes, GPUs and CPUs, Ray's version here and there."""
    version = _installed("ray")
    if settings.executor != "ray":
        return [ok("ray", f"ray {version}" if version else
                   "ray not installed (needed only for --executor ray: pip install 'autoloop[ray]')")]
    if not version:
        return [fail("ray", "--executor ray needs ray: pip install 'autoloop[ray]'")]
    from autoloop.execution.executors.ray_executor import cluster_report

    good, lines = cluster_report(settings.ray_address, settings.gpus_per_trial, settings.nodes_per_trial)
    return [(ok if good else fail)("ray", line) for line in lines]


def _sbatch_test_only(root: Path, settings: Settings) -> Check:
    """Would Slurm take a trial's job as the night will ask for it? ``sbatch --test-only`` says,
    before a night queues anything (a bad option, a partition without the GPUs, no such account)."""
    from autoloop.execution.executors.slurm import test_only

    took, said = test_only(settings, root)
    return ok("sbatch", f"--test-only: {said}") if took else fail("sbatch", f"--test-only refused the job: {said}")


def _isolation(settings: Settings) -> Check:
    from autoloop.execution.isolate import isolation_available

    available, why = isolation_available()
    if available:
        return ok("isolate", "network namespaces work here: --isolate can run trials offline")
    if settings.isolate:
        return fail("isolate", f"--isolate is set, but network namespaces are not available ({why})")
    return warn("isolate", f"--isolate would not work here ({why})")


def _notify(settings: Settings, send: bool) -> list[Check]:
    """Each --notify URL's form as apprise reads it (its ${VAR}s set); one test message each
    only when asked. A bad URL fails: `autoloop run` refuses to start with it."""
    if not settings.notify:
        return []
    from autoloop.observe.notify import NotifyError, check_url, load_apprise, masked, send_once

    try:
        apprise = load_apprise()
    except NotifyError as e:
        return [fail("notify", str(e))]
    checks = []
    for url in settings.notify:
        shown = masked(apprise, url, os.environ)
        why = check_url(url)
        if why:
            checks.append(fail("notify", f"{shown}: {why}"))
        elif send:
            failed = send_once(apprise, url, "autoloop doctor", "a test notification from autoloop doctor",
                               os.environ)
            checks.append(fail("notify", f"{shown}: the test notification was not delivered ({failed})") if failed
                          else ok("notify", f"{shown}: the test notification was delivered"))
        else:
            checks.append(ok("notify", f"{shown}: its form is right (--notify-test sends one)"))
    return checks


# Words `sh -c` runs without looking on PATH.
_SHELL_WORDS = frozenset("! . : [ alias break case cd command continue echo eval exec exit export false for if "
                         "printf read return set shift test times trap true type ulimit umask unset wait while "
                         "{ (".split())


def _hooks(root: Path, settings: Settings) -> list[Check]:
    """Each hook's command: valid sh, and its first word a builtin, on PATH or a file in the
    repository. A bad one warns: a hook's failure never stops the night, but it never runs either."""
    import shlex

    checks = []
    for event, command in settings.hooks.items():
        syntax = subprocess.run(["/bin/sh", "-n", "-c", command], capture_output=True, text=True, timeout=10)
        if syntax.returncode != 0:
            said = " ".join(syntax.stderr.split())[:200] or f"exit code {syntax.returncode}"
            checks.append(warn("hook", f"--on {event}: not a valid sh command ({said})"))
            continue
        try:
            words = shlex.split(command)
        except ValueError as e:
            checks.append(warn("hook", f"--on {event}: {e}"))
            continue
        first = next((w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)), "")
        found = (first in _SHELL_WORDS or shutil.which(first) is not None
                 or ("/" in first and os.access(root / first, os.X_OK)))
        checks.append(ok("hook", f"--on {event}: {first} (limit {settings.hook_timeout:g}s)") if found else
                      warn("hook", f"--on {event}: {first!r} is neither on PATH nor an executable file here"))
    return checks


def _gpus(settings: Settings) -> Check:
    """The NVIDIA GPUs, their memory and how they are linked, from nvidia-smi (no torch: it
    also answers for a torch without CUDA), and whether --gpus-per-trial fits."""
    if settings.executor == "slurm" and settings.slurm_cluster == "slurm":
        return ok("gpus", "on the trials' nodes, bound by Slurm (the sbatch check asks the partition)")
    if settings.executor == "ray":
        return ok("gpus", "on the trials' nodes, bound by Ray (the ray check lists them)")
    if shutil.which("nvidia-smi") is None:
        return ok("gpus", "none: no nvidia-smi on this machine")
    # compute_cap: what train.py trains in there; drivers before 510 do not know the field.
    listing = (_output(["nvidia-smi", "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader"],
                       Path.cwd())
               or _output(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader"], Path.cwd()))
    gpus = [[cell.strip() for cell in line.split(",")] for line in listing.splitlines() if line.count(",") >= 2]
    if not gpus:
        return warn("gpus", "nvidia-smi lists no GPU (driver not loaded?)")
    shown = "; ".join(f"{i}: {name}, {memory}{_precision(rest)}" for i, name, memory, *rest in gpus)
    links = nvlink_summary(_output(["nvidia-smi", "topo", "-m"], Path.cwd()))
    wanted = settings.gpus_per_trial * max(1, settings.workers)
    if settings.device != "cpu" and settings.gpus_per_trial > 1 and wanted > len(gpus):
        return fail("gpus", f"{shown}; {links}; --gpus-per-trial {settings.gpus_per_trial} x --workers "
                    f"{settings.workers} needs {wanted}")
    return ok("gpus", f"{shown}; {links}")


def _precision(cells: list[str]) -> str:
    """", sm75: fp16 with a GradScaler (...)" from nvidia-smi's compute_cap cell, if it gave one."""
    found = re.fullmatch(r"(\d+)\.(\d+)", cells[0]) if cells else None
    if found is None:
        return ""
    capability = (int(found[1]), int(found[2]))
    return f", sm{capability[0]}{capability[1]}: trains in {torch_floor.half_precision(capability)}"


def nvlink_summary(topo: str) -> str:
    """One phrase from `nvidia-smi topo -m`: do the GPUs talk over NVLink (NV<n> cells) or
    through PCIe and the host (PIX, PXB, PHB, NODE, SYS)? Data parallelism all-reduces every
    gradient each step, so that link bounds a multi-GPU trial."""
    # A GPU's row has its own "X" cell; the header (GPU0 GPU1 ..., its tab stripped) has none.
    rows = [line.split() for line in topo.splitlines() if re.match(r"^GPU\d+\s", line) and "X" in line.split()]
    count = len(rows)
    if count < 2:
        return "one GPU: no links" if count else "topology unknown (nvidia-smi topo -m said nothing)"
    pairs = [row[1 + j] for i, row in enumerate(rows) for j in range(i + 1, count) if len(row) > 1 + j]
    nvlinks = [cell for cell in pairs if re.fullmatch(r"NV\d+", cell)]
    if len(nvlinks) == len(pairs):
        return f"NVLink between all {count} GPUs ({', '.join(sorted(set(nvlinks)))})"
    others = ", ".join(sorted({cell for cell in pairs if cell not in nvlinks}))
    if nvlinks:
        return f"NVLink between {len(nvlinks)} of {len(pairs)} GPU pairs, the others through {others}"
    return f"no NVLink: the GPUs talk through {others} (PCIe/host)"


def _installed(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def _output(argv: list[str], cwd: Path) -> str:
    try:
        out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
