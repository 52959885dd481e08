"""``--isolate``: run trials without network access, in a network namespace of their own (Linux).

The runner calls :func:`enter_network_namespace` in the trial's child process after the fork
and before the exec (``preexec_fn``), so the trial keeps everything the runner sets up: its
own session, the trial token in its environment, the orchestrator as subreaper. The new
namespace holds nothing but a loopback interface, which is brought up (libraries such as
torch.distributed talk to themselves over 127.0.0.1); the host's interfaces, and its
loopback too, are out of reach.

Root (CAP_SYS_ADMIN) can unshare the network namespace directly. Anyone else gets EPERM
and then tries an unprivileged user namespace with the network namespace in it, mapping
the user's own uid and gid onto themselves, so files the trial writes keep their owner.

Python 3.11 has no ``os.unshare``: the system call goes through ctypes. The child runs
between fork and exec, where only async-signal-safe work is strictly allowed: everything it
needs (libc handle, modules) is loaded beforehand in the parent, and it takes no lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
import subprocess
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_IFREQ = "16sh22x"          # struct ifreq: name, flags, the rest of the union (40 bytes in all)

_libc = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(None, use_errno=True)


class IsolationError(OSError):
    """The child could not enter a network namespace."""


def _unshare(flags: int) -> int:
    """0, or the errno of unshare(2). A function of its own so tests can stand in for the kernel."""
    if _libc is None or not hasattr(_libc, "unshare"):
        return errno.ENOSYS
    return 0 if _libc.unshare(flags) == 0 else ctypes.get_errno()


def _write_proc(name: str, text: str) -> None:
    fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _loopback_up() -> None:
    """Best effort: a trial that cannot talk to itself over 127.0.0.1 still runs."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


def enter_network_namespace() -> None:
    """Move the calling process (the trial's child, before exec) into a new network namespace;
    raises IsolationError with the reason when the system does not allow it."""
    uid, gid = os.getuid(), os.getgid()
    err = _unshare(CLONE_NEWNET)
    if err == errno.EPERM:
        # Not privileged: an unprivileged user namespace may still own a network namespace.
        err = _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        if err:
            raise IsolationError(err, "no permission to create a network namespace, and no unprivileged "
                                      f"user namespace either ({os.strerror(err)})")
        try:
            _write_proc("setgroups", "deny")   # required before an unprivileged gid_map
            _write_proc("uid_map", f"{uid} {uid} 1")
            _write_proc("gid_map", f"{gid} {gid} 1")
        except OSError as exc:
            raise IsolationError(exc.errno,
                                 f"cannot map the user into the new user namespace ({exc.strerror})") from None
    elif err == errno.ENOSYS:
        raise IsolationError(err, "unshare(2) is not available")
    elif err:
        raise IsolationError(err, f"unshare(CLONE_NEWNET) failed ({os.strerror(err)})")
    _loopback_up()


def _probe_child() -> None:
    # Runs in a forked child: report on stderr and leave before the exec ever happens.
    try:
        enter_network_namespace()
    except OSError as exc:
        os.write(2, (exc.strerror or str(exc)).encode())
        os._exit(1)
    os._exit(0)


def isolation_available() -> tuple[bool, str]:
    """(True, "") when trials can be put in a network namespace here, else (False, why).

    Tried for real in a throwaway child (fork, unshare, exit before exec), since only the
    kernel knows: capabilities, seccomp filters and sysctls all have a say."""
    if not sys.platform.startswith("linux"):
        return False, f"this is {sys.platform}, not Linux"
    if _libc is None or not hasattr(_libc, "unshare"):
        return False, "unshare(2) is not available in this C library"
    try:
        # The command is never run: the child exits in preexec_fn, before exec.
        proc = subprocess.run([sys.executable], preexec_fn=_probe_child, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"cannot start a probe process: {exc}"
    if proc.returncode == 0:
        return True, ""
    return False, proc.stderr.decode(errors="replace").strip() or f"probe exited with {proc.returncode}"
