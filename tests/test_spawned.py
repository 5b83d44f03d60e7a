"""tests/spawned.py, the run's check for processes a test left running: a process that leads a
group of its own (an OVOS stack's) is stopped with everything it spawned, a member that
outlives its leader or ignores SIGTERM included. Zombies (gone but for their parent's wait)
are not counted as running, so nothing here waits for PID 1 to reap an orphan."""
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager

from spawned import group_members, running, stop, stop_all
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


def test_groups_stopped_together_share_one_grace():
    """Three groups whose members ignore SIGTERM: all killed once one grace has passed, not
    one grace after another (an OVOS stack's services are stopped this way)."""
    with ExitStack() as stack:
        leaders = [stack.enter_context(leader_with_a_child(CHILD_IGNORING_TERM))
                   for _ in range(3)]
        started = time.monotonic()
        stop_all(leaders, group=True, grace=1.0)
        took = time.monotonic() - started
        assert all(leader.poll() is not None for leader in leaders)
        assert wait_until(lambda: not any(group_members(leader.pid) for leader in leaders))
        assert 1.0 <= took < 3.0, took      # one grace; one after another: 3 s at least
