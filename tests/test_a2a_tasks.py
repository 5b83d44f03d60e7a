"""core/a2a_tasks.TaskBook without I/O: a context is one session per caller, what a message
naming a task means, and what the bounded store forgets (a fake clock)."""
import pytest
from fake_clock import FakeClock

from hivemind_chat_agent.core.a2a_tasks import ANSWER, NEW, Refused, TaskBook


def test_a_context_is_one_session_per_caller_stable_and_short():
    book = TaskBook()
    assert book.session_for("", "ctx") == TaskBook().session_for("", "ctx")   # a restart
    assert book.session_for("", "ctx") != book.session_for("", "other")
    assert book.session_for("key-a", "ctx") != book.session_for("key-b", "ctx")
    assert len(book.session_for("", "x" * 10000)) < 40


def test_a_message_naming_a_task_answers_it_only_while_it_waits_for_input():
    book = TaskBook()
    assert book.meaning("", "t1", "c1") == NEW            # its first message
    book.stored("t1", "", "c1", "working")
    with pytest.raises(Refused, match="still answering"):
        book.meaning("", "t1", "c1")
    book.stored("t1", "", "c1", "input-required")
    assert book.meaning("", "t1", "c1") == ANSWER
    with pytest.raises(Refused, match="another context"):
        book.meaning("", "t1", "c2")
    with pytest.raises(Refused, match="not known"):       # another key never reaches it
        book.meaning("key-other", "t1", "c1")
    book.stored("t1", "", "c1", "completed")
    with pytest.raises(Refused, match="has ended"):
        book.meaning("", "t1", "c1")


def test_the_store_is_bounded_oldest_idle_first_and_running_tasks_kept():
    clock = FakeClock()
    book = TaskBook(max_tasks=2, keep_for=100, clock=clock.now)
    assert book.stored("run", "", "c", "working") == []
    clock.advance(1)
    assert book.stored("a", "k", "c", "completed") == []
    clock.advance(1)
    assert book.stored("b", "", "c", "input-required") == [("a", "k")]   # the oldest idle
    clock.advance(1)
    assert book.stored("c", "", "c", "working") == [("b", "")]
    assert book.stored("d", "", "c", "working") == []    # only running ones: none forgotten
    assert len(book) == 3 and book.state_of("run") == "working"


def test_ended_and_waiting_tasks_expire_after_keep_for():
    clock = FakeClock()
    book = TaskBook(max_tasks=100, keep_for=10, clock=clock.now)
    book.stored("asked", "", "c", "input-required")
    book.stored("run", "", "c", "working")
    clock.advance(10)
    assert book.stored("new", "", "c", "working") == [("asked", "")]
    assert book.state_of("asked") is None and book.state_of("run") == "working"


def test_a_bound_below_one_is_refused():
    with pytest.raises(ValueError):
        TaskBook(max_tasks=0)


class ScanningBook:
    """The bounded store as it was first written, scanning every task at every save: what
    TaskBook must forget, in the same order."""

    def __init__(self, max_tasks, keep_for, clock):
        self.max_tasks, self.keep_for, self.clock, self.tasks = max_tasks, keep_for, clock, {}

    def stored(self, task_id, caller, state):
        self.tasks.pop(task_id, None)
        self.tasks[task_id] = (caller, state, self.clock())
        now = self.clock()
        idle = [t for t, (_, s, _) in self.tasks.items() if s != "working"]
        expired = [t for t in idle if now - self.tasks[t][2] >= self.keep_for]
        excess = len(self.tasks) - len(expired) - self.max_tasks
        rest = [t for t in idle if t not in set(expired)] if excess > 0 else []
        return [(t, self.tasks.pop(t)[0]) for t in expired + rest[:max(0, excess)]]


def test_the_store_forgets_what_a_scan_of_every_task_would():
    import random
    rng = random.Random(30)
    clock = FakeClock()
    book = TaskBook(max_tasks=20, keep_for=50, clock=clock.now)
    scan = ScanningBook(20, 50, clock.now)
    for _ in range(5000):
        clock.advance(rng.choice([0, 0, 1, 3]))
        task_id = f"t{rng.randrange(60)}"
        state = rng.choice(["working", "working", "input-required", "completed", "canceled"])
        caller = rng.choice(["", "key-a"])
        assert book.stored(task_id, caller, "c", state) == scan.stored(task_id, caller, state)
        assert len(book) == len(scan.tasks)


def test_a_save_on_a_full_store_does_not_scan_it():
    """The SDK saves a task at every event (three before a turn's first sentence): a scan of
    1000 kept tasks at each cost the first sentence about 2 ms."""
    import time
    book = TaskBook(max_tasks=1000)
    for n in range(1000):
        book.stored(f"old{n}", "", "c", "completed")
    started = time.perf_counter()
    for n in range(20000):
        book.stored(f"new{n}", "", "c", "working" if n % 2 else "completed")
    assert time.perf_counter() - started < 1.0      # a scan each: 9.7 s here
    assert len(book) == 10000                      # the running ones, always kept
