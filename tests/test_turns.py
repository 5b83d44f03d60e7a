"""Turn tracking and reply parsing, without sockets."""
import pytest

from hivemind_chat_agent.replies import MAX_UTTERANCE_CHARS, ReplyKind, parse_reply
from hivemind_chat_agent.turns import Ended, Sentence, Turn, TurnState, TurnTable


def ctx(sid="s1", tag="t1"):
    c = {"session": {"session_id": sid, "lang": "en-US"}}
    if tag is not None:
        c["hivemind_chat_turn"] = tag
    return c


def reply(msg_type, data=None, sid="s1", tag="t1"):
    r, why = parse_reply(msg_type, data or {}, ctx(sid, tag))
    assert r is not None, why
    return r


def speak(text, sid="s1", tag="t1", msg_type="speak"):
    return reply(msg_type, {"utterance": text}, sid, tag)


def new_turn(sid="s1", tag="t1", timeout=10.0, now=0.0):
    return Turn(session_id=sid, tag=tag, timeout=timeout, started_at=now)


# ---- parse_reply: every hostile shape is rejected with a reason ----
@pytest.mark.parametrize("msg_type,data,context", [
    (None, {}, ctx()),
    (7, {}, ctx()),
    ("speak", "not a dict", ctx()),
    ("speak", {"utterance": 42}, ctx()),
    ("speak", {"utterance": "x" * (MAX_UTTERANCE_CHARS + 1)}, ctx()),
    ("speak", {"utterance": "hi"}, "not a dict"),
    ("speak", {"utterance": "hi"}, {}),
    ("speak", {"utterance": "hi"}, {"session": "nope"}),
    ("speak", {"utterance": "hi"}, {"session": {"session_id": 3}}),
    ("speak", {"utterance": "hi"}, {"session": {"session_id": ""}}),
    ("speak", {"utterance": "hi"}, {"session": {"session_id": "s1"}, "hivemind_chat_turn": 5}),
    ("speak", {"utterance": "hi"}, {"session": {"session_id": "s1",
                                                **{f"k{i}": i for i in range(500)}}}),
])
def test_malformed_replies_are_rejected_with_a_reason(msg_type, data, context):
    r, why = parse_reply(msg_type, data, context)
    assert r is None and why


def test_reply_kinds_cover_old_and_new_topic_names():
    assert speak("a").kind is ReplyKind.SPEAK
    assert speak("a", msg_type="ovos.utterance.speak").kind is ReplyKind.SPEAK
    assert reply("ovos.utterance.handled").kind is ReplyKind.HANDLED
    assert reply("complete_intent_failure").kind is ReplyKind.UNMATCHED
    assert reply("ovos.intent.unmatched").kind is ReplyKind.UNMATCHED
    assert reply("ovos.utterance.cancelled").kind is ReplyKind.CANCELLED
    assert reply("something.else").kind is ReplyKind.OTHER
    assert parse_reply("speak", None, ctx())[0] is None      # speak needs an utterance
    assert parse_reply("ovos.utterance.handled", None, ctx())[0].kind is ReplyKind.HANDLED


# ---- Turn: the state machine ----
def test_sentences_then_handled():
    t = new_turn()
    assert t.state is TurnState.WAITING
    assert t.receive(speak("one"), 1.0) == [Sentence("one")]
    assert t.state is TurnState.SPEAKING
    assert t.receive(speak("two"), 2.0) == [Sentence("two")]
    assert t.handled() == [Ended(TurnState.HANDLED)]
    assert t.sentences == ["one", "two"]
    assert t.receive(speak("late"), 4.0) == []       # nothing after the end


def test_timeout_rolls_forward_on_every_speak():
    t = new_turn(timeout=5.0, now=0.0)
    assert t.expire(4.9) == []
    t.receive(speak("one"), 4.0)
    assert t.deadline == 9.0
    assert t.expire(8.9) == []
    events = t.expire(9.0)
    assert len(events) == 1 and events[0].state is TurnState.TIMED_OUT


@pytest.mark.parametrize("msg_type,state", [("complete_intent_failure", TurnState.UNMATCHED),
                                            ("ovos.intent.unmatched", TurnState.UNMATCHED),
                                            ("ovos.utterance.cancelled", TurnState.CANCELLED)])
def test_failure_and_cancel_end_the_turn_at_once(msg_type, state):
    t = new_turn()
    [ended] = t.receive(reply(msg_type), 0.1)
    assert ended.state is state and ended.reason


def test_both_speak_names_for_one_sentence_are_delivered_once():
    t = new_turn()
    assert t.receive(speak("a"), 0) == [Sentence("a")]
    assert t.receive(speak("a", msg_type="ovos.utterance.speak"), 0) == []
    assert t.receive(speak("b"), 0) == [Sentence("b")]
    assert t.sentences == ["a", "b"]


def test_empty_sentence_rolls_timeout_but_is_not_delivered():
    t = new_turn(timeout=1)
    assert t.receive(speak("  "), 5.0) == []
    assert t.deadline == 6.0


def test_lost_and_abort_are_final_and_idempotent():
    t = new_turn()
    assert t.lose("socket closed") == [Ended(TurnState.LOST, "socket closed")]
    assert t.lose("again") == [] and t.abort("x") == []
    assert t.state.is_final


# ---- TurnTable: routing ----
def test_replies_route_by_session_and_tag():
    table = TurnTable()
    a, b = new_turn("a", "ta"), new_turn("b", "tb")
    table.open(a)
    table.open(b)
    turn, events, _ = table.route(speak("for a", "a", "ta"), 0)
    assert turn is a and events == [Sentence("for a")]
    turn, events, _ = table.route(speak("for b", "b", "tb"), 0)
    assert turn is b and events == [Sentence("for b")]
    assert a.sentences == ["for a"] and b.sentences == ["for b"]


def test_reply_for_unknown_session_or_old_tag_is_ignored():
    table = TurnTable()
    table.open(new_turn("a", "t2"))
    for r in (speak("x", "zzz", "t2"), speak("old", "a", "t1"), speak("none", "zzz", None)):
        turn, events, why = table.route(r, 0)
        assert turn is None and events == [] and why


def test_two_turns_on_one_session_are_refused():
    table = TurnTable()
    table.open(new_turn("a", "t1"))
    with pytest.raises(RuntimeError):
        table.open(new_turn("a", "t2"))


def speak_q(text, sid="s1", tag="t1"):
    return reply("speak", {"utterance": text, "expect_response": True}, sid, tag)


def test_handled_ends_the_turn_through_the_table():
    table = TurnTable()
    t = new_turn("a", "t1")
    table.open(t)
    table.route(speak("x", "a", "t1"), 0)
    turn, events, why = table.route(reply("ovos.utterance.handled", sid="a", tag="t1"), 0)
    assert turn is t and events == [Ended(TurnState.HANDLED)] and why == ""
    assert table.owed("a") == []


@pytest.mark.parametrize("tagged", [True, False])
def test_handled_owed_by_an_early_end_never_ends_the_next_turn(tagged):
    """complete_intent_failure, then its handled: before or after the turn is closed."""
    for handled_before_close in (True, False):
        table = TurnTable()
        first = new_turn("a", "t1")
        table.open(first)
        table.route(reply("complete_intent_failure", sid="a", tag="t1" if tagged else None), 0)
        assert first.state is TurnState.UNMATCHED
        late = reply("ovos.utterance.handled", sid="a", tag="t1" if tagged else None)
        if handled_before_close:
            assert table.route(late, 0)[2] == ""       # accepted: pays the debt
        table.close(first)
        second = new_turn("a", "t2")
        table.open(second)
        if not handled_before_close:
            turn, events, why = table.route(late, 0)
            assert events == [] and why == ""          # first's debt, not second's end
        assert second.state is TurnState.WAITING
        table.route(speak("answer", "a", "t2" if tagged else None), 0)
        turn, events, _ = table.route(
            reply("ovos.utterance.handled", sid="a", tag="t2" if tagged else None), 0)
        assert turn is second and events == [Ended(TurnState.HANDLED)]


@pytest.mark.parametrize("tagged", [True, False])
def test_a_question_ends_the_turn_and_its_continuation_is_the_next_turns_answer(tagged):
    """get_response: the skill asks (expect_response), the user answers in the next turn, the
    skill's handler goes on speaking under the first utterance, and both handled arrive."""
    tag = (lambda t: t) if tagged else (lambda t: None)
    table = TurnTable()
    first = new_turn("a", "t1")
    table.open(first)
    _, events, _ = table.route(speak_q("what colour?", "a", tag("t1")), 0)
    assert events == [Sentence("what colour?"), Ended(TurnState.ASKED, events[1].reason)]
    assert first.state.in_step
    table.close(first)
    second = new_turn("a", "t2")
    table.open(second)
    # the answer utterance is consumed at once: its handled comes first
    turn, events, why = table.route(reply("ovos.utterance.handled", sid="a", tag=tag("t2")), 0)
    assert events == [] and why == ""
    # then the first handler continues, under the first utterance's context
    _, events, _ = table.route(speak("blue it is", "a", tag("t1")), 0)
    assert events == [Sentence("blue it is")]
    turn, events, _ = table.route(reply("ovos.utterance.handled", sid="a", tag=tag("t1")), 0)
    assert turn is second and events == [Ended(TurnState.HANDLED)]
    assert table.owed("a") == []


def test_a_failure_tagged_for_an_earlier_utterance_does_not_end_this_turn():
    table = TurnTable()
    first = new_turn("a", "t1")
    table.open(first)
    table.route(speak_q("really?", "a", "t1"), 0)
    table.close(first)
    second = new_turn("a", "t2")
    table.open(second)
    turn, events, why = table.route(reply("ovos.utterance.cancelled", sid="a", tag="t1"), 0)
    assert turn is None and why and second.state is TurnState.WAITING


def test_stale_tag_is_ignored_and_unowed_handled_too():
    table = TurnTable()
    table.open(new_turn("a", "t2"))
    assert table.route(reply("ovos.utterance.handled", sid="a", tag="t0"), 0)[2]
    table2 = TurnTable()
    assert table2.route(reply("ovos.utterance.handled", sid="a", tag=None), 0)[2]
