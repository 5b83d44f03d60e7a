"""The hub's transcript of each satellite session (core/transcript.py), without I/O."""
import pytest

from hivemind_chat_agent.core.transcript import ANSWERED, STOPPED, Exchange, Transcripts


def test_the_engine_gets_the_answered_exchanges_then_the_new_utterance():
    book = Transcripts(history_turns=10)
    book.record("s", Exchange("my name is Ada", "Nice to meet you, Ada.", ANSWERED))
    book.record("s", Exchange("tell me a story", "Once upon", STOPPED))     # barge-in
    book.record("s", Exchange("and then?", "", "engine_error"))            # not an answer
    book.record("s", Exchange("hello", "", ANSWERED))                       # nothing said
    assert book.messages("s", "what is my name?") == [
        ("user", "my name is Ada"), ("assistant", "Nice to meet you, Ada."),
        ("user", "tell me a story"), ("assistant", "Once upon"),
        ("user", "what is my name?")]
    assert [e.ended for e in book.history("s")][-2:] == ["engine_error", ANSWERED]
    assert book.messages("other", "hi") == [("user", "hi")]


def test_sessions_keep_their_last_turns_within_their_bytes():
    book = Transcripts(history_turns=3, history_bytes=1000)
    for i in range(5):
        book.record("s", Exchange(f"q{i}", f"a{i}", ANSWERED))
    assert [e.user for e in book.history("s")] == ["q2", "q3", "q4"]
    book.record("s", Exchange("long", "x" * 900, ANSWERED))
    assert sum(e.size for e in book.history("s")) <= 1000
    assert book.history("s")[-1].user == "long"
    book.record("s", Exchange("y" * 5000, "z" * 5000, ANSWERED))          # alone too long
    [only] = book.history("s")
    assert only.size <= 1000 and only.assistant.endswith("z") and only.user.endswith("y")


def test_zero_history_turns_keeps_nothing_and_sends_one_message():
    book = Transcripts(history_turns=0)
    book.record("s", Exchange("q", "a", ANSWERED))
    assert len(book) == 0 and book.messages("s", "next") == [("user", "next")]


def test_forgetting_a_session_releases_it():
    book = Transcripts()
    book.record("s", Exchange("q", "a", ANSWERED))
    book.forget("s")
    assert "s" not in book and len(book) == 0


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        Transcripts(history_turns=-1)
    with pytest.raises(ValueError):
        Transcripts(history_bytes=10)
