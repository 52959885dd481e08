"""A trial's log file, written as the output comes, optionally capped.

Uncapped, the output goes to the file as it comes. Capped at ``cap`` bytes, the log keeps the
first half and the last half of the output around one line saying how much was cut::

    <first cap/2 bytes>
    [autoloop: 167772160 bytes (163840 lines) of output cut here]
    <last cap/2 bytes>

The end matters most: the crash classifier and the fix requests read it. So while the trial
runs, the first half goes to the log file and everything after it to spill pieces of cap/2
bytes, ``<log>.tail-0``, ``-1``, ..., of which only the last two are kept. The latest output is
then always on disk, nothing accumulates in memory, and the files of one log never exceed
1.5 x cap, whatever happens. When the trial ends the log is put together (``finish_log``);
after a ``kill -9`` of the orchestrator the head and the pieces stay (the head ends with a
line naming them), and recovery puts them together the same way, lines cut left uncounted.
"""

from __future__ import annotations

import os
import re
import threading
from io import FileIO
from pathlib import Path
from typing import BinaryIO

COPY_CHUNK = 1 << 20     # copying pieces together: bounded memory
LINE_WINDOW = 4096       # cut at a line end when one is this near the cut point

PIECE_INFIX = ".tail-"   # <log>.tail-<k>: output past the head of a capped log while the trial runs
_SPILL_NOTE = ("\n[autoloop] output past the first {head} bytes goes to {name}" + PIECE_INFIX
               + "* in pieces of {piece} bytes until the trial ends\n")
_SPILL_NOTE_RE = re.compile(rb"\n\[autoloop\] output past the first (\d+) bytes goes to \S+ in pieces of (\d+) bytes")


_Part = tuple[Path, int, int]   # (file, offset, length): a run of bytes of the log's tail


def _write_all(file: FileIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[file.write(view):]


def _pieces(path: Path) -> list[tuple[int, Path]]:
    """The spill pieces of a capped log, oldest first."""
    prefix = path.name + PIECE_INFIX
    found: list[tuple[int, Path]] = []
    for piece in path.parent.glob(re.sub(r"([*?[])", r"[\1]", prefix) + "*"):
        suffix = piece.name[len(prefix):]
        if suffix.isdigit():
            found.append((int(suffix), piece))
    return sorted(found)


def _count_lines(parts: list[_Part]) -> int:
    lines = 0
    for source, offset, length in parts:
        with open(source, "rb") as piece:
            piece.seek(offset)
            lines += _copy(piece, None, length)
    return lines


def _copy(src: BinaryIO, dst: BinaryIO | None, length: int) -> int:
    """Copy length bytes (fewer at end of file) in 1 MiB chunks, or only read them when dst
    is None; returns the newlines seen."""
    lines = 0
    while length > 0:
        chunk = src.read(min(COPY_CHUNK, length))
        if not chunk:
            break
        if dst is not None:
            dst.write(chunk)
        lines += chunk.count(b"\n")
        length -= len(chunk)
    return lines


def finish_log(path: Path, spilled_lines: int | None = None) -> tuple[int, int | None]:
    """Put a capped log together from its head and its last two spill pieces: head, a line
    saying what was cut, tail. Returns (bytes cut, lines cut or None when not counted).

    Called when a trial ends, and by recovery for the log of a trial whose orchestrator was
    killed (the lines are not counted then). The result goes to a side file renamed over
    the log, and the pieces are removed only after that, so a kill at any moment leaves
    either the log and its pieces or the finished log: calling this again completes it."""
    pieces = _pieces(path)
    if not pieces:
        return 0, None
    note = _spill_note(path)
    if note is None:  # already put together; only the removal of the pieces was missed
        _remove(pieces)
        return 0, None
    head_len, piece_size = note
    tail, spilled = _tail_parts(pieces, piece_size)
    keep_head = head_len
    if spilled > _total(tail):
        keep_head, tail[0] = _cut_at_lines(path, head_len, min(LINE_WINDOW, piece_size // 8), tail[0])
    cut = head_len - keep_head + spilled - _total(tail)
    cut_lines = spilled_lines - _count_lines(tail) if cut and spilled_lines is not None else None
    _write_finished(path, keep_head, cut, cut_lines, tail)
    _remove(pieces)
    return cut, cut_lines


def _spill_note(path: Path) -> tuple[int, int] | None:
    """(head bytes, piece bytes) from the note at the end of the head, which says where the
    pieces start; None when the log has none (it was put together already)."""
    with open(path, "rb") as log:
        log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
        found = _SPILL_NOTE_RE.search(log.read())
    return None if found is None else (int(found.group(1)), int(found.group(2)))


def _remove(pieces: list[tuple[int, Path]]) -> None:
    for _, piece in pieces:
        piece.unlink(missing_ok=True)


def _total(parts: list[_Part]) -> int:
    return sum(length for _, _, length in parts)


def _tail_parts(pieces: list[tuple[int, Path]], piece_size: int) -> tuple[list[_Part], int]:
    """The last piece_size bytes of output that the pieces hold (the last piece, topped up
    from the end of the one before when it is there), and how many bytes were spilled."""
    last_index, last = pieces[-1]
    last_len = last.stat().st_size
    spilled = last_index * piece_size + last_len  # each piece was filled before the next began
    tail = [(last, 0, last_len)]
    if last_len < piece_size and len(pieces) > 1 and pieces[-2][0] == last_index - 1:
        previous = pieces[-2][1]
        take = min(previous.stat().st_size, piece_size - last_len)
        tail.insert(0, (previous, previous.stat().st_size - take, take))
    return tail, spilled


def _cut_at_lines(path: Path, head_len: int, window: int, first: _Part) -> tuple[int, _Part]:
    """The head's length and the tail's first part moved to line ends when one is within
    ``window`` bytes of the cut: whole lines read better on both sides."""
    keep_head = head_len
    with open(path, "rb") as log:
        log.seek(max(0, head_len - window))
        end = log.read(head_len - log.tell()).rfind(b"\n")
    if end >= 0:
        keep_head = max(0, head_len - window) + end + 1
    source, offset, length = first
    with open(source, "rb") as piece:
        piece.seek(offset)
        newline = piece.read(min(window, length)).find(b"\n")
    if 0 <= newline < length - 1:
        first = (source, offset + newline + 1, length - newline - 1)
    return keep_head, first


def _write_finished(path: Path, keep_head: int, cut: int, cut_lines: int | None, tail: list[_Part]) -> None:
    """Head, the line saying what was cut (when anything was), tail: to a side file renamed
    over the log."""
    part = path.with_name(path.name + ".part")
    with open(path, "rb") as log, open(part, "wb") as out:
        _copy(log, out, keep_head)
        if cut:
            log.seek(max(0, keep_head - 1))
            if keep_head and log.read(1) != b"\n":  # the marker gets a line of its own
                out.write(b"\n")
            counted = "" if cut_lines is None else f" ({cut_lines} lines)"
            out.write(f"[autoloop: {cut} bytes{counted} of output cut here]\n".encode())
        for source, offset, length in tail:
            with open(source, "rb") as piece:
                piece.seek(offset)
                _copy(piece, out, length)
    os.replace(part, path)

class RunLog:
    """One log, written by the runner's reader thread (the output) and by the runner itself
    (its notes); cap_bytes None or 0: no cap. close() puts a capped log together."""

    def __init__(self, path: Path, cap_bytes: int | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        for _, stale in _pieces(path):  # from an earlier run of the same attempt
            stale.unlink(missing_ok=True)
        self._file = open(path, "wb", buffering=0)  # unbuffered: the file grows as the trial prints
        self._lock = threading.Lock()
        self.notes: list[str] = []
        self.cut_bytes = 0
        self.cut_lines: int | None = None
        self._head_left = cap_bytes // 2 if cap_bytes else None
        self._piece_size = max(1, cap_bytes - cap_bytes // 2) if cap_bytes else 0
        self._piece: FileIO | None = None   # the spill piece being written
        self._piece_index = -1
        self._piece_len = 0
        self._spilled_lines = 0
        self._failed = False

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._failed or self._file.closed:
                return
            try:
                if self._head_left is None:
                    _write_all(self._file, data)
                    return
                if self._head_left:
                    head = data[:self._head_left]
                    _write_all(self._file, head)
                    self._head_left -= len(head)
                    data = data[len(head):]
                while data:
                    piece = self._piece
                    if piece is None or self._piece_len >= self._piece_size:
                        piece = self._next_piece()
                    part = data[:self._piece_size - self._piece_len]
                    _write_all(piece, part)
                    self._piece_len += len(part)
                    self._spilled_lines += part.count(b"\n")
                    data = data[len(part):]
            except OSError as exc:  # disk full: keep draining the pipe, or the trial would block
                self._failed = True
                self.notes.append(f"[autoloop] log writing stopped: {exc}")

    def _next_piece(self) -> FileIO:
        if self._piece is None:
            head = self._file.tell()
            _write_all(self._file, _SPILL_NOTE.format(head=head, name=self.path.name, piece=self._piece_size).encode())
        else:
            self._piece.close()
        self._piece_index += 1
        if self._piece_index >= 2:  # two pieces back falls out of the tail: its bytes are the ones cut
            self.path.with_name(f"{self.path.name}{PIECE_INFIX}{self._piece_index - 2}").unlink(missing_ok=True)
        self._piece = open(self.path.with_name(f"{self.path.name}{PIECE_INFIX}{self._piece_index}"),
                           "wb", buffering=0)  # open across writes, closed by the next rotation or close()
        self._piece_len = 0
        return self._piece

    def note(self, text: str) -> None:
        """A line of the runner's own, marked so that nobody takes it for trial output."""
        line = f"[autoloop] {text}"
        self.notes.append(line)
        self.write(line.encode() + b"\n")

    def close(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.close()
            if self._piece is None:
                return
            self._piece.close()
            try:
                self.cut_bytes, self.cut_lines = finish_log(self.path, self._spilled_lines)
            except OSError as exc:  # disk full again: the pieces stay, bounded, next to the log
                self.notes.append(f"[autoloop] log not put together: {exc}")
