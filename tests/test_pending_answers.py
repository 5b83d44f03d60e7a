"""core/pending_answers.PendingAnswers without I/O: what an MCP `ask` returned of a turn, what
is left, and the bounds on what is kept, on a clock the test moves."""
import pytest

from hivemind_chat_agent.core.pending_answers import PendingAnswers, Portion


class Clock:
    def __init__(self):
        self.time = 100.0

    def __call__(self):
        return self.time


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def book(clock):
    return PendingAnswers(clock, keep_for=60.0, per_caller=2, limit=5)


def test_every_sentence_is_handed_out_once_in_order_then_the_turn_is_forgotten(book):
    token, dropped = book.begin("key-a", "kitchen")
    assert dropped == []
    book.said(token, "one")
    assert book.take(token) == Portion(("one",), False)
    assert book.take(token) == Portion((), False)          # nothing new: nothing repeated
    assert book.find("key-a", "kitchen") == token
    assert book.collect(token)
    book.said(token, "two")
    book.said(token, "three")
    book.ended(token, asked=True)
    book.said(token, "after the end")                       # ignored
    assert book.is_over(token)
    assert book.take(token) == Portion(("two", "three"), True, expect_response=True)
    assert book.find("key-a", "kitchen") is None and len(book) == 0
    assert book.take(token) is None


def test_an_uncollected_turn_is_forgotten_keep_for_after_its_last_portion(book, clock):
    token, _ = book.begin("key-a", "c")
    clock.time += 1000                     # while its ask waits, no deadline runs
    assert book.expired() == [] and book.next_deadline() is None
    book.take(token)                       # the budget passed: part returned
    assert book.next_deadline() == clock.time + 60
    clock.time += 59.9
    assert book.expired() == []
    assert book.collect(token)             # the next ask came: no deadline while it waits
    clock.time += 30
    assert book.expired() == []
    book.take(token)
    clock.time += 60
    assert book.expired() == [token]
    assert book.find("key-a", "c") is None and not book.collect(token)
    assert book.is_over(token)             # nothing to wait for once forgotten


def test_a_caller_keeps_at_most_per_caller_unfinished_turns_the_oldest_goes(book):
    first, _ = book.begin("key-a", "one")
    book.take(first)
    second, _ = book.begin("key-a", "two")
    book.take(second)
    other, dropped = book.begin("key-b", "one")             # another caller: not counted
    assert dropped == []
    third, dropped = book.begin("key-a", "three")
    assert dropped == [first]
    assert book.find("key-a", "one") is None and book.find("key-b", "one") == other
    # turns whose ask is waiting on them are never taken from under it
    fourth, dropped = book.begin("key-a", "four")
    assert dropped == [second]                              # third is still being collected
    fifth, dropped = book.begin("key-a", "five")
    assert dropped == []                                    # third and fourth both collecting
    assert {book.find("key-a", c) for c in ("three", "four", "five")} == {third, fourth, fifth}


def test_everyone_together_keeps_at_most_limit(clock):
    book = PendingAnswers(clock, keep_for=60.0, per_caller=10, limit=3)
    tokens = []
    for k in range(3):
        token, dropped = book.begin(f"key-{k}", "c")
        book.take(token)
        tokens.append(token)
        assert dropped == []
    _, dropped = book.begin("key-9", "c")
    assert dropped == [tokens[0]] and len(book) == 3


def test_a_new_utterance_replaces_the_turn_pending_in_its_conversation(book):
    old, _ = book.begin("key-a", "c")
    book.said(old, "old one")
    book.take(old)
    new, dropped = book.begin("key-a", "c")
    assert dropped == [old] and new != old
    book.said(old, "late words of the old turn")           # never reach the new one
    book.said(new, "new one")
    book.ended(new)
    assert book.take(old) is None
    assert book.take(new) == Portion(("new one",), True)


def test_a_failure_is_the_result_only_of_a_turn_that_said_nothing(book):
    boom = RuntimeError("hub gone")
    silent, _ = book.begin("key-a", "silent")
    book.ended(silent, error=boom)
    assert book.take(silent) == Portion((), True, error=boom)
    spoke, _ = book.begin("key-a", "spoke")
    book.said(spoke, "part")
    book.take(spoke)
    book.collect(spoke)
    book.ended(spoke, error=boom)
    assert book.take(spoke) == Portion((), True)           # what was said stands


def test_bounds_are_checked(clock):
    for bad in ({"keep_for": 0}, {"per_caller": 0}, {"limit": 0}):
        with pytest.raises(ValueError):
            PendingAnswers(clock, **bad)
