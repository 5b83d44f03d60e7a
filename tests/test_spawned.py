"""tests/spawned.py, the run's check for processes a test left running: a process that leads a
group of its own (an OVOS stack's) is stopped with everything it spawned."""
import os
import signal
import subprocess
import sys

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


def test_a_group_leader_is_stopped_with_its_children():
    # a leader that spawns a child which ignores nothing and outlives its parent's SIGTERM
    leader = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, time; subprocess.Popen(['sleep', '60']); "
                               "time.sleep(60)"], start_new_session=True)
    try:
        assert wait_until(lambda: len(members(leader.pid)) == 2)      # leader and child
        stop(leader, group=True)
        assert leader.poll() is not None
        assert wait_until(lambda: not group_alive(leader.pid))        # the child too
    finally:
        if group_alive(leader.pid):
            os.killpg(leader.pid, signal.SIGKILL)


def test_without_group_only_the_process_is_stopped():
    leader = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, time; subprocess.Popen(['sleep', '60']); "
                               "time.sleep(60)"], start_new_session=True)
    try:
        assert wait_until(lambda: len(members(leader.pid)) == 2)      # leader and child
        stop(leader)
        assert leader.poll() is not None
        assert group_alive(leader.pid)            # the child outlived it: what group= is for
    finally:
        if group_alive(leader.pid):
            os.killpg(leader.pid, signal.SIGKILL)
