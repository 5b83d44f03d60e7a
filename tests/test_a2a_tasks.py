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
