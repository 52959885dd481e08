"""`--notify URL`: the night's events (core/night_events.py) where people read them.

Delivery is apprise's (the optional extra ``autoloop[notify]``): one library, kept up by its
authors, that speaks to Slack, Discord, Telegram, ntfy, e-mail, Matrix, Teams, Pushover and
plain JSON/form webhooks (``json://host:port/path``) from a URL each, so that autoloop writes
no client of any service itself; its URL is also the one setting a person copies from the
service's own page.

Secrets: a URL may hold ``${VAR}`` placeholders, filled from the environment just before each
send and never kept: the settings, the ledger, results.tsv and the console only ever see the
URL as written (a warning line shows apprise's privacy form, its tokens masked, with every
filled-in value masked too).

Never slowing the night: events go to one background thread through a queue. A send is tried
``TRIES`` times with a short pause; a URL that still fails is one warning line, said once per
URL a night, and gets one try per event from then on. Each kind of event goes out at most
once per ``--notify-every`` (the stop and the end always). At the end the thread gets
``CLOSE_TIMEOUT_S`` to deliver what is queued, one try each; a target that failed before
gets only the stop and the end then.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from autoloop.core.errors import AutoloopError
from autoloop.core.night_events import ALWAYS_SENT, NightEvent

TRIES = 3                 # a target that is down for a moment (a restart) still gets the event
PAUSE_S = 2.0             # between tries; cut short when the night is closing
CLOSE_TIMEOUT_S = 15.0    # what the end of the night waits for queued sends at most
# apprise's own limits per request (URL arguments cto/rto), so that a target that accepts the
# connection and never answers holds the delivery thread, never the night, for seconds.
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class NotifyError(AutoloopError):
    """--notify cannot be set up (apprise missing, a malformed URL, an unset variable)."""


def load_apprise() -> Any:
    try:
        import apprise
    except ImportError:
        raise NotifyError("--notify: apprise is not installed (pip install 'autoloop[notify]')") from None
    # apprise logs each failure as a warning; with no handler Python would print it on stderr,
    # in the middle of the night's console. Failures are said by this module, once per URL.
    logging.getLogger("apprise").addHandler(logging.NullHandler())
    logging.getLogger("apprise").propagate = False
    return apprise


def placeholders(url: str) -> list[str]:
    return _PLACEHOLDER.findall(url)


def expand(url: str, environ: Mapping[str, str]) -> str:
    """The URL with each ${VAR} filled from ``environ``; NotifyError naming an unset one."""
    def fill(m: re.Match[str]) -> str:
        value = environ.get(m.group(1))
        if not value:
            raise NotifyError(f"--notify: ${{{m.group(1)}}} is not set in the environment")
        return value
    return _PLACEHOLDER.sub(fill, url)


def masked(apprise: Any, url: str, environ: Mapping[str, str]) -> str:
    """The URL as a log line may show it: apprise's privacy form without its arguments,
    filled-in values masked."""
    shown = url.split("?", 1)[0]
    try:
        plugin = apprise.Apprise.instantiate(expand(url, environ))
        if plugin is not None:
            # Its query string can carry tokens the privacy form leaves in (a webhook's +headers).
            shown = plugin.url(privacy=True).split("?", 1)[0]
    except NotifyError:
        pass
    return redact(shown, url, environ)


def redact(text: str, url: str, environ: Mapping[str, str]) -> str:
    for name in placeholders(url):
        value = environ.get(name)
        if value and len(value) >= 3:
            text = text.replace(value, "***")
    return text


def check_url(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """None when apprise knows the URL's form, else why not (one line); nothing is sent."""
    apprise = load_apprise()
    environ = os.environ if environ is None else environ
    try:
        filled = expand(url, environ)
    except NotifyError as e:
        return str(e).removeprefix("--notify: ")
    if apprise.Apprise.instantiate(filled) is None:
        scheme = url.split("://", 1)[0]
        return f"apprise does not understand {scheme}:// URLs of this form (its wiki lists each service's)"
    return None


def send_once(apprise: Any, url: str, title: str, body: str, environ: Mapping[str, str]) -> str | None:
    """One try to deliver: None when delivered, else why not (redacted)."""
    try:
        target = apprise.Apprise()
        if not target.add(expand(url, environ)):
            return "apprise does not understand the URL"
        with apprise.LogCapture(level=logging.WARNING, fmt="%(message)s") as said:
            delivered = target.notify(body=body, title=title)
        if delivered:
            return None
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        return redact(" ".join(lines[-1].split())[:300] if lines else "not delivered", url, environ)
    except NotifyError as e:
        return str(e)
    except Exception as e:  # a notification never stops the night
        return redact(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", url, environ)


class Notifier:
    """The --notify URLs of one night, fed from its events, sending on a thread of its own."""

    def __init__(self, urls: list[str], every_s: float, warn: Callable[[str], None],
                 environ: Mapping[str, str] | None = None, pause_s: float = PAUSE_S):
        self.apprise = load_apprise()
        self.environ = os.environ if environ is None else environ
        for url in urls:   # a setup mistake is said now, before the baseline, not at the first best
            why = check_url(url, self.environ)
            if why:
                raise NotifyError(f"--notify {masked(self.apprise, url, self.environ)}: {why}")
        self.urls, self.every_s, self.warn, self.pause_s = urls, every_s, warn, pause_s
        self.last_sent: dict[str, float] = {}
        self.held_back: dict[str, int] = {}
        self.delivered = 0
        self.dropped = 0
        self.failed: set[str] = set()
        self._closing = threading.Event()
        self._queue: queue.Queue[NightEvent | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="autoloop-notify", daemon=True)
        self._thread.start()

    def send(self, event: NightEvent) -> bool:
        """Queue the event (returns at once); False when the rate limit holds it back."""
        now = time.monotonic()
        last = self.last_sent.get(event.kind)
        if event.kind not in ALWAYS_SENT and last is not None and now - last < self.every_s:
            self.held_back[event.kind] = self.held_back.get(event.kind, 0) + 1
            return False
        self.last_sent[event.kind] = now
        held = self.held_back.pop(event.kind, 0)
        if held:
            event.text += f"\n({held} more of these since the last notification)"
        self._queue.put(event)
        return True

    def _work(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            for url in self.urls:
                self._deliver(url, event)

    def _deliver(self, url: str, event: NightEvent) -> None:
        if self._closing.is_set() and url in self.failed and event.kind not in ALWAYS_SENT:
            # A target that failed before: the end waits for its stop and summary alone.
            self.dropped += 1
            return
        why: str | None = None
        # A URL that failed all its tries before, or the night's end: one try, so that a dead
        # target (one that never answers costs apprise's 4 s timeout a try) cannot build up a
        # queue the end of the night would wait for.
        tries = 1 if url in self.failed or self._closing.is_set() else TRIES
        for attempt in range(tries):
            if attempt:
                self._closing.wait(self.pause_s)
            why = send_once(self.apprise, url, event.title, event.text, self.environ)
            if why is None:
                self.delivered += 1
                return
        if url not in self.failed:
            self.failed.add(url)
            self.warn(f"notify {masked(self.apprise, url, self.environ)}: {event.kind} not delivered after "
                      f"{tries} tr{'ies' if tries > 1 else 'y'} ({why}); the night goes on, later events get one "
                      "try each and their failures are not said")

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.warn(f"notify: still sending after {timeout:.0f}s; {self._queue.qsize()} event(s) left unsent")
