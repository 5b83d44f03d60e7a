"""Every server and hub process the tests start, so that the run's end finds those a test left
running (tests/conftest.py stops them and fails the run, naming each): a leaked process keeps
its port and acts on whatever later reaches it (a half-started Sentinel set, left by a failed
fixture, once went on watching and failing over through the tests after it)."""
import subprocess

_SPAWNED: "list[tuple[subprocess.Popen, str]]" = []


def record(process: subprocess.Popen, where: str) -> None:
    """`process` was started for a test; `where`: its folder, named if it is left running."""
    _SPAWNED.append((process, where))


def stop(process: subprocess.Popen) -> None:
    """`process` ended if it runs: terminated, killed if it has not exited 10 s later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_those_left() -> "list[str]":
    """Every recorded process still running stopped; their folders."""
    left = [where for process, where in _SPAWNED if process.poll() is None]
    for process, _where in _SPAWNED:
        stop(process)
    _SPAWNED.clear()
    return left
