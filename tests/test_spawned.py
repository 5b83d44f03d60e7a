"""tests/spawned.py, the run's check for processes a test left running: a process that leads a
group of its own (an OVOS stack's) is stopped with everything it spawned, a member that
outlives its leader or ignores SIGTERM included. Zombies (gone but for their parent's wait)
are not counted as running, so nothing here waits for PID 1 to reap an orphan."""
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

from spawned import group_members, running, stop
from waiting import wait_until

CHILD_IGNORING_TERM = ["sh", "-c", "trap '' TERM; sleep 60 & wait"]


@contextmanager
def leader_with_a_child(child=("sleep", "60"), leader_exits=False):
    """A process leading a group of its own with a child of its own (as ovos-core's are),
    both running (or only the child, `leader_exits`); whatever is left of the group killed at
    the end."""
    code = (f"import subprocess, time; subprocess.Popen({list(child)!r}); "
            + ("time.sleep(0.2)" if leader_exits else "time.sleep(60)"))
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        assert wait_until(lambda: len(group_members(leader.pid)) >= 2)
        if leader_exits:
            leader.wait(10)
        yield leader
    finally:
        if group_members(leader.pid):
            os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_group_leader_is_stopped_with_its_children():
    with leader_with_a_child() as leader:
        stop(leader, group=True)
        assert leader.poll() is not None
        assert wait_until(lambda: not group_members(leader.pid))      # the child too


def test_without_group_only_the_process_is_stopped():
    with leader_with_a_child() as leader:
        stop(leader)
        assert leader.poll() is not None
        assert group_members(leader.pid)        # the child outlived it: what group= is for


def test_a_member_that_ignores_sigterm_after_its_leader_left_is_found_and_killed():
    with leader_with_a_child(CHILD_IGNORING_TERM, leader_exits=True) as leader:
        assert leader.poll() is not None and running(leader, group=True)
        stop(leader, group=True, grace=0.5)
        assert wait_until(lambda: not group_members(leader.pid))
        assert not running(leader, group=True)
