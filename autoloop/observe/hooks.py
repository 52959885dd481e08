"""`--on EVENT=CMD` (a ``[hooks]`` table in the config file): a command run per event.

The command runs through ``/bin/sh -c`` in the repository, as a run of the runner
(execution/runner.py): its own process group and cgroup where the machine gives one, its
whole tree ended at ``--hook-timeout``, its output in ``results/hooks/<n>-<event>.log``. It
gets the event (core/night_events.py, ``review/schemas/event.schema.json``) as JSON on its
stdin, kept beside the log as ``<n>-<event>.json``, and in environment variables:
``AUTOLOOP_EVENT`` (the kind), ``AUTOLOOP_EVENT_FILE`` (that JSON file),
``AUTOLOOP_EVENT_TITLE``, ``AUTOLOOP_EVENT_TEXT`` and ``AUTOLOOP_TAG``. The network is not
taken away even under ``--isolate``: a hook's job is mostly to reach somewhere.

Hooks run one at a time on a background thread, so a slow one holds neither the trial nor the
next proposal; a failure or a timeout is one warning line, never a stop.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from autoloop.core.night_events import NightEvent
from autoloop.execution.runner import RunOutcome, RunSpec, run_process

HOOKS_DIR = "hooks"
LOG_CAP_BYTES = 1 << 20    # a hook's log: its first and last halves past 1 MiB
CLOSE_MARGIN_S = 15.0      # the end of the night waits for queued hooks: their limits plus this


class Hooks:
    def __init__(self, commands: dict[str, str], root: Path, results_dir: Path, timeout_s: float,
                 warn: Callable[[str], None]):
        self.commands, self.root, self.timeout_s, self.warn = commands, Path(root), max(timeout_s, 1.0), warn
        self.dir = Path(results_dir) / HOOKS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.count = len(list(self.dir.glob("*.json")))   # numbering goes on across starts
        self.outcomes: list[tuple[str, RunOutcome]] = []
        self._queue: queue.Queue[NightEvent | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="autoloop-hooks", daemon=True)
        self._thread.start()

    def send(self, event: NightEvent) -> bool:
        """Queue the event's hook, if one is set (returns at once)."""
        if event.kind not in self.commands:
            return False
        self._queue.put(event)
        return True

    def _work(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self.outcomes.append((event.kind, self.run(event)))
            except Exception as e:  # a hook never stops the night
                self.warn(f"hook {event.kind}: could not run ({type(e).__name__}: {' '.join(str(e).split())[:200]})")

    def run(self, event: NightEvent) -> RunOutcome:
        """Run the event's hook now, to its end or its limit; says a failure in one line."""
        self.count += 1
        stem = f"{self.count}-{event.kind}"
        payload = self.dir / f"{stem}.json"
        payload.write_text(json.dumps(event.payload(), indent=1) + "\n")
        env = {"AUTOLOOP_EVENT": event.kind, "AUTOLOOP_EVENT_FILE": str(payload), "AUTOLOOP_TAG": event.tag,
               "AUTOLOOP_EVENT_TITLE": event.title, "AUTOLOOP_EVENT_TEXT": event.text}
        spec = RunSpec(command=["/bin/sh", "-c", self.commands[event.kind]], cwd=self.root, env=env,
                       log_path=self.dir / f"{stem}.log", budget_s=self.timeout_s, timeout_s=self.timeout_s,
                       stdin_path=payload, log_cap_bytes=LOG_CAP_BYTES, grace_s=2.0)
        outcome = run_process(spec)
        where = f"results/{HOOKS_DIR}/{stem}.log"
        if outcome.timed_out:
            self.warn(f"hook {event.kind}: ended at its limit of {self.timeout_s:g}s (--hook-timeout); "
                      f"its output: {where}")
        elif outcome.launch_error:
            self.warn(f"hook {event.kind}: could not start ({outcome.launch_error})")
        elif outcome.exit_code != 0:
            how = f"exit code {outcome.exit_code}" if outcome.exit_code is not None else f"signal {outcome.signal}"
            self.warn(f"hook {event.kind}: failed ({how}); its output: {where}; the night goes on")
        return outcome

    def close(self) -> None:
        waiting = self._queue.qsize() + 1
        self._queue.put(None)
        self._thread.join(waiting * (self.timeout_s + 5.0) + CLOSE_MARGIN_S)
        if self._thread.is_alive():
            self.warn("hooks: still running at the end; left behind")
