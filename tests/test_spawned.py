"""tests/spawned.py, the run's check for processes a test left running: a process that leads a
group of its own (an OVOS stack's) is stopped with everything it spawned."""
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

from spawned import stop
from waiting import wait_until


def members(pgid: int) -> "list[str]":
    done = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return done.stdout.split()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@contextmanager
def leader_with_a_child():
    """A process leading a group of its own with a child of its own (as ovos-core's are),
    both running; whatever is left of the group killed at the end."""
    leader = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, time; subprocess.Popen(['sleep', '60']); "
                               "time.sleep(60)"], start_new_session=True)
    try:
        assert wait_until(lambda: len(members(leader.pid)) == 2)
        yield leader
    finally:
        if group_alive(leader.pid):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_group_leader_is_stopped_with_its_children():
    with leader_with_a_child() as leader:
        stop(leader, group=True)
        assert leader.poll() is not None
        assert wait_until(lambda: not group_alive(leader.pid))        # the child too


def test_without_group_only_the_process_is_stopped():
    with leader_with_a_child() as leader:
        stop(leader)
        assert leader.poll() is not None
        assert group_alive(leader.pid)            # the child outlived it: what group= is for
