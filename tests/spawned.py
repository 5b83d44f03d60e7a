"""Every server, hub, OVOS and Home Assistant process the tests start, so that the run's end
finds those a test left running (tests/conftest.py stops them and fails the run, naming each):
a leaked process keeps its port and acts on whatever later reaches it (a half-started Sentinel
set, left by a failed fixture, once went on watching and failing over through the tests after
it)."""
import os
import signal
import subprocess

_SPAWNED: "list[tuple[subprocess.Popen, str, bool]]" = []


def record(process: subprocess.Popen, where: str, group: bool = False) -> None:
    """`process` was started for a test; `where`: its folder, named if it is left running;
    `group`: it leads a process group of its own (start_new_session), which is stopped whole
    (an OVOS stack's processes spawn their own children)."""
    _SPAWNED.append((process, where, group))


def stop(process: subprocess.Popen, group: bool = False) -> None:
    """`process` (its whole group if `group`) ended if it runs: terminated, killed if it has
    not exited 10 s later."""
    if process.poll() is None:
        _signal(process, signal.SIGTERM, group)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL, group)
            process.wait()


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
    left = [where for process, where, _ in _SPAWNED if process.poll() is None]
    for process, _where, group in _SPAWNED:
        stop(process, group)
    _SPAWNED.clear()
    return left
