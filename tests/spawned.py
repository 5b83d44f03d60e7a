"""Every server, hub, OVOS and Home Assistant process the tests start, so that the run's end
finds those a test left running (tests/conftest.py stops them and fails the run, naming each):
a leaked process keeps its port and acts on whatever later reaches it (a half-started Sentinel
set, left by a failed fixture, once went on watching and failing over through the tests after
it)."""
import os
import signal
import subprocess
import time

_SPAWNED: "list[tuple[subprocess.Popen, str, bool]]" = []


def record(process: subprocess.Popen, where: str, group: bool = False) -> None:
    """`process` was started for a test; `where`: its folder, named if it is left running;
    `group`: it leads a process group of its own (start_new_session), which is stopped whole
    (an OVOS stack's processes spawn their own children)."""
    _SPAWNED.append((process, where, group))


def stop(process: subprocess.Popen, group: bool = False, grace: float = 10.0) -> None:
    """`process` ended if it runs, and with `group` every live member of its group (one that
    outlived its leader too): terminated, killed if any is still running `grace` s later."""
    stop_all([process], group, grace)


def stop_all(processes: "list[subprocess.Popen]", group: bool = False,
             grace: float = 10.0) -> None:
    """Every one of `processes` ended as `stop` ends one, side by side: all terminated first,
    then whichever still runs `grace` s later killed (one deadline for all: an OVOS stack's
    services shut down together, where one after the other each could take its own `grace`)."""
    live = [process for process in processes if running(process, group)]
    for process in live:
        _signal(process, signal.SIGTERM, group)
    deadline = time.monotonic() + grace
    while any(running(process, group) for process in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in live:
        if running(process, group):
            _signal(process, signal.SIGKILL, group)
    for process in live:
        process.wait()


def running(process: subprocess.Popen, group: bool = False) -> bool:
    """The process runs, or with `group` any member of its group that is not a zombie."""
    return process.poll() is None or (group and bool(group_members(process.pid)))


def group_members(pgid: int) -> "list[int]":
    """The processes of group `pgid` that run (/proc; zombies, which are gone but for their
    parent's wait, are not counted)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue                       # gone meanwhile
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return members


def _signal(process: subprocess.Popen, signum: int, group: bool) -> None:
    try:
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
    except ProcessLookupError:
        pass


def stop_those_left() -> "list[str]":
    """Every recorded process still running stopped; their folders."""
    left = [where for process, where, group in _SPAWNED if running(process, group)]
    for process, _where, group in _SPAWNED:
        stop(process, group)
    _SPAWNED.clear()
    return left
