"""Turn tracking and reply parsing, without sockets."""
import pytest

from hivemind_chat_agent.core.replies import MAX_UTTERANCE_CHARS, ReplyKind, parse_reply
from hivemind_chat_agent.core.turns import Absorb, Ended, Progress, Sentence, Turn, TurnTable


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
    listening = reply("alarm.skill.get_response.waiting")
    assert listening.kind is ReplyKind.QUESTION_LISTENING and listening.skill_id == "alarm.skill"
    assert reply(".get_response.waiting").kind is ReplyKind.OTHER      # no skill named
    assert parse_reply("speak", None, ctx())[0] is None      # speak needs an utterance
    assert parse_reply("ovos.utterance.handled", None, ctx())[0].kind is ReplyKind.HANDLED


# ---- Turn: the state machine ----
def test_sentences_then_handled():
    t = new_turn()
    assert t.state is Progress.WAITING
    assert t.receive(speak("one"), 1.0) == [Sentence("one")]
    assert t.state is Progress.SPEAKING
    assert t.receive(speak("two"), 2.0) == [Sentence("two")]
    assert t.handled() == [Ended(Progress.HANDLED)]
    assert t.spoken == 2
    assert t.receive(speak("late"), 4.0) == []       # nothing after the end


def test_timeout_rolls_forward_on_every_speak():
    t = new_turn(timeout=5.0, now=0.0)
    assert t.expire(4.9) == []
    t.receive(speak("one"), 4.0)
    assert t.deadline == 9.0
    assert t.expire(8.9) == []
    events = t.expire(9.0)
    assert len(events) == 1 and events[0].state is Progress.TIMED_OUT


@pytest.mark.parametrize("msg_type,state", [("complete_intent_failure", Progress.UNMATCHED),
                                            ("ovos.intent.unmatched", Progress.UNMATCHED),
                                            ("ovos.utterance.cancelled", Progress.CANCELLED)])
def test_failure_and_cancel_end_the_turn_at_once(msg_type, state):
    t = new_turn()
    [ended] = t.receive(reply(msg_type), 0.1)
    assert ended.state is state and ended.reason


def test_both_speak_names_for_one_sentence_are_delivered_once():
    t = new_turn()
    assert t.receive(speak("a"), 0) == [Sentence("a")]
    assert t.receive(speak("a", msg_type="ovos.utterance.speak"), 0) == []
    assert t.receive(speak("b"), 0) == [Sentence("b")]
    assert t.spoken == 2


def test_empty_sentence_rolls_timeout_but_is_not_delivered():
    t = new_turn(timeout=1)
    assert t.receive(speak("  "), 5.0) == []
    assert t.deadline == 6.0


def test_lost_and_abort_are_final_and_idempotent():
    t = new_turn()
    assert t.lose("socket closed") == [Ended(Progress.LOST, "socket closed")]
    assert t.lose("again") == [] and t.abort("x") == []
    assert t.state.is_final


# ---- TurnTable: routing ----
def test_replies_route_by_session_and_tag():
    table = TurnTable()
    a, b = new_turn("a", "ta"), new_turn("b", "tb")
    table.open(a)
    table.open(b)
    r = table.route(speak("for a", "a", "ta"), 0)
    assert r.turn is a and r.events == [Sentence("for a")] and r.absorb is Absorb.ALL
    r = table.route(speak("for b", "b", "tb"), 0)
    assert r.turn is b and r.events == [Sentence("for b")]
    assert a.spoken == 1 and b.spoken == 1


def test_speech_outside_the_running_turn_is_an_aside_and_never_changes_the_session():
    """An alarm, or a turn that gave up long ago: its speech goes to the subscribers."""
    table = TurnTable()
    t = new_turn("a", "t2")
    table.open(t)
    for r in (speak("x", "zzz", "t2"), speak("old", "a", "t1")):
        routed = table.route(r, 0)
        assert routed.turn is None and routed.events == [] and routed.aside == r.utterance
        assert routed.absorb is Absorb.NOTHING
    assert t.spoken == 0 and t.state is Progress.WAITING
    routed = table.route(reply("mycroft.scheduler.schedule_event", sid="a", tag="t0"), 0)
    assert routed.ignored and routed.absorb is Absorb.NOTHING


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
    r = table.route(reply("ovos.utterance.handled", sid="a", tag="t1"), 0)
    assert r.turn is t and r.events == [Ended(Progress.HANDLED)] and r.ignored == ""
    assert table.owed("a") == []
    table.close(t)
    assert table.sessions() == []     # nothing kept for an idle session


@pytest.mark.parametrize("tagged", [True, False])
def test_handled_owed_by_an_early_end_never_ends_the_next_turn(tagged):
    """complete_intent_failure, then its handled: before or after the turn is closed."""
    for handled_before_close in (True, False):
        table = TurnTable()
        first = new_turn("a", "t1")
        table.open(first)
        table.route(reply("complete_intent_failure", sid="a", tag="t1" if tagged else None), 0)
        assert first.state is Progress.UNMATCHED
        late = reply("ovos.utterance.handled", sid="a", tag="t1" if tagged else None)
        if handled_before_close:
            assert table.route(late, 0).ignored == ""      # accepted: pays the debt
        table.close(first)
        second = new_turn("a", "t2")
        table.open(second)
        if not handled_before_close:
            r = table.route(late, 0)
            assert r.events == [] and r.ignored == ""     # first's debt, not second's end
        assert second.state is Progress.WAITING
        table.route(speak("answer", "a", "t2" if tagged else None), 0)
        r = table.route(reply("ovos.utterance.handled", sid="a", tag="t2" if tagged else None), 0)
        assert r.turn is second and r.events == [Ended(Progress.HANDLED)]


def ask(table, tag_of, skill="alarm.skill"):
    """Turn t1 asks the way a skill's get_response() does on a genuine ovos-core."""
    first = new_turn("a", "t1")
    table.open(first)
    table.route(reply("skill.converse.get_response.enable", {"skill_id": skill}, "a",
                      tag_of("t1")), 0)
    r = table.route(speak_q("what time?", "a", tag_of("t1")), 0)
    assert r.events == [Sentence("what time?"), Ended(Progress.ASKED, r.events[1].reason)]
    assert first.state is Progress.ASKED
    table.close(first)
    return first


@pytest.mark.parametrize("tagged", [True, False])
def test_an_answer_taken_by_get_response_ends_with_the_questions_handled(tagged):
    """What ovos-core 2.1.1 sends: the answer is routed to `<skill>.converse.get_response`
    (tagged with the answer, which never gets a handled of its own); the skill's reply is tagged
    with the asking utterance, and the asking utterance's handled ends the answering turn."""
    tag = (lambda t: t) if tagged else (lambda t: None)
    table = TurnTable()
    ask(table, tag)
    second = new_turn("a", "t2")
    table.open(second)
    r = table.route(reply("alarm.skill.converse.get_response", {"utterances": ["7 am"]}, "a",
                          tag("t2")), 0)
    assert r.turn is second and r.events == []
    assert second.answers == "t1" and table.owed("a") == ["t1", "t2"]
    r = table.route(reply("skill.converse.get_response.disable", {"skill_id": "alarm.skill"},
                          "a", tag("t1")), 0)
    assert r.events == [] and r.absorb is Absorb.ALL
    r = table.route(speak("alarm set for 7", "a", tag("t1")), 0)
    assert r.turn is second and r.events == [Sentence("alarm set for 7")]
    r = table.route(reply("ovos.utterance.handled", sid="a", tag=tag("t1")), 0)
    assert r.turn is second and r.events == [Ended(Progress.HANDLED)]
    table.close(second)
    assert table.owed("a") == [] and table.sessions() == []


def test_an_answer_taken_by_get_response_ends_with_its_own_handled_on_ovos_core_3():
    """What ovos-core 3.7 sends (measured behind hivemind-core 5.3.10a1): the skill's reply is
    tagged with the asking utterance as before, but the *answer's* utterance gets the handled,
    and the question's never does."""
    table = TurnTable()
    ask(table, lambda t: t)
    second = new_turn("a", "t2")
    table.open(second)
    table.route(reply("alarm.skill.get_response.waiting", {}, "a", "t1"), 0)
    table.route(reply("alarm.skill.converse.get_response", {"utterances": ["7 am"]}, "a",
                      "t2"), 0)
    table.route(reply("skill.converse.get_response.disable", {"skill_id": "alarm.skill"}, "a",
                      "t1"), 0)
    r = table.route(speak("alarm set for 7", "a", "t1"), 0)
    assert r.turn is second and r.events == [Sentence("alarm set for 7")]
    r = table.route(reply("ovos.utterance.handled", sid="a", tag="t2"), 0)
    assert r.turn is second and r.events == [Ended(Progress.HANDLED)]
    table.close(second)
    assert table.owed("a") == [] and table.sessions() == []


def test_the_next_turn_waits_until_the_asking_skill_listens_at_most_listen_within():
    """ovos-workshop takes an answer handed over before its get_response() thread listens and
    then returns None (the skill gives up): the next utterance of the session goes once the
    skill says `<skill>.get_response.waiting`, or LISTEN_WITHIN after the question if it never
    does; a session without an open question goes at once."""
    table = TurnTable()
    assert table.listening_by("a") is None
    ask(table, lambda t: t)                                  # asked at 0
    assert table.listening_by("a") == TurnTable.LISTEN_WITHIN
    assert table.listening_by("other") is None
    r = table.route(reply("alarm.skill.get_response.waiting", {}, "a", "t1"), 0.05)
    assert r.absorb is Absorb.RESPONSE_MODE and r.events == []    # routed as before
    assert table.listening_by("a") is None
    # a skill that never says it listens holds the answer LISTEN_WITHIN after its question
    table = TurnTable()
    ask(table, lambda t: t)
    table.route(reply("other.skill.get_response.waiting", {}, "a", "t1"), 0.05)
    assert table.listening_by("a") == TurnTable.LISTEN_WITHIN
    # a question that ended (its handled) holds nothing
    table.route(reply("ovos.utterance.handled", sid="a", tag="t1"), 0.5)
    assert table.listening_by("a") is None and table.sessions() == []


def test_an_answer_that_asks_again_ends_asked_and_the_next_answer_goes_to_the_same_question():
    table = TurnTable()
    ask(table, lambda t: t)
    second = new_turn("a", "t2")
    table.open(second)
    table.route(reply("alarm.skill.converse.get_response", {}, "a", "t2"), 0)
    r = table.route(speak_q("I did not get that, what time?", "a", "t1"), 0)
    assert r.events[-1].state is Progress.ASKED
    table.close(second)
    third = new_turn("a", "t3")
    table.open(third)
    table.route(reply("alarm.skill.converse.get_response", {}, "a", "t3"), 0)
    assert third.answers == "t1"
    r = table.route(reply("ovos.utterance.handled", sid="a", tag="t1"), 0)
    assert r.turn is third and r.events == [Ended(Progress.HANDLED)]


def test_an_abandoned_question_never_holds_up_an_unrelated_turn():
    """The skill gave up on its question (its late speech is an aside, its session update only
    says it stopped listening); the next turn is matched normally and ends on its own handled,
    whether the question's handled comes before, during or never."""
    for when in ("before", "during", "never"):
        table = TurnTable()
        ask(table, lambda t: t)
        r = table.route(speak("I didn't hear a time", "a", "t1"), 0)
        assert r.aside == "I didn't hear a time" and r.absorb is Absorb.RESPONSE_MODE
        done = reply("ovos.utterance.handled", sid="a", tag="t1")
        if when == "before":
            assert table.route(done, 0).absorb is Absorb.RESPONSE_MODE
        third = new_turn("a", "t3")
        table.open(third)
        if when == "during":
            r = table.route(done, 0)
            assert r.turn is None and r.events == [] and third.state is Progress.WAITING
        r = table.route(speak("hello", "a", "t3"), 0)
        assert r.turn is third
        r = table.route(reply("ovos.utterance.handled", sid="a", tag="t3"), 0)
        assert r.events == [Ended(Progress.HANDLED)]


def test_a_failure_tagged_for_an_earlier_utterance_does_not_end_this_turn():
    table = TurnTable()
    first = new_turn("a", "t1")
    table.open(first)
    table.route(speak_q("really?", "a", "t1"), 0)
    table.close(first)
    second = new_turn("a", "t2")
    table.open(second)
    r = table.route(reply("ovos.utterance.cancelled", sid="a", tag="t1"), 0)
    assert r.turn is None and second.state is Progress.WAITING


def test_stale_tag_is_ignored_and_unowed_handled_too():
    table = TurnTable()
    table.open(new_turn("a", "t2"))
    assert table.route(reply("ovos.utterance.handled", sid="a", tag="t0"), 0).ignored
    table2 = TurnTable()
    assert table2.route(reply("ovos.utterance.handled", sid="a", tag=None), 0).ignored


def test_debts_are_bounded_when_a_hub_never_sends_handled():
    table = TurnTable()
    for i in range(100):
        t = new_turn("a", f"t{i}")
        table.open(t)
        table.close(t)
    assert len(table.owed("a")) == TurnTable.MAX_OWED


@pytest.mark.parametrize("reason, error", [
    ("busy", "HubBusyError"), ("engine_error", "HubEngineError"), ("timeout", "HubEngineError"),
    ("store_unavailable", "ConversationStoreError"), ("draining", "HubDrainingError")])
def test_a_hubs_failure_reason_becomes_its_typed_error(reason, error):
    from hivemind_chat_agent.core.outcomes import TurnStatus, judge
    from hivemind_chat_agent.core.turns import Ended, EndReason, Progress
    outcome = judge(Ended(Progress.UNMATCHED, "why", EndReason.read(reason)), spoke=False,
                    refusal=None, terminated=False, agent_closed=False, timeout=10)
    assert outcome.status is TurnStatus.FAILED and type(outcome.error).__name__ == error


# ---- one turn through the client, socket-free: nobody reads it, it still ends ----
class OneConnection:
    """The pool as a turn's driver uses it, holding one ready connection (the pool's own
    policies are tests/test_pool.py's); it counts what the driver leased and gave back."""

    def __init__(self, conn, clock):
        from hivemind_chat_agent.client.churn_gate import ChurnGate
        self.conn, self.leases, self.discarded, self.drained = conn, 0, [], []
        self.gate = ChurnGate(0, stagger=0, clock=clock)

    def acquire(self, session, abandonment=None):
        self.leases += 1
        return self.conn

    def release(self, conn):
        self.leases -= 1

    def discard(self, session_id):
        self.discarded.append(session_id)

    def broke(self, session_id, conn):
        self.broken = getattr(self, "broken", []) + [session_id]

    def hub_draining(self, conn):
        self.drained.append(conn)


class Host:
    """What client/turn_driver.DriverHost asks of the agent, from real parts."""

    def __init__(self, pool, config):
        from hivemind_chat_agent.client.session_book import SessionBook
        self.pool, self.settings, self.sessions = pool, config, SessionBook("d")
        self.hub_keeps_turns, self.closed = False, False
        from hivemind_chat_agent.client.observer import NO_OBSERVER
        self.observer = NO_OBSERVER

    def sessions_in_use(self, current):
        return {current}


def test_a_turn_nobody_reads_still_ends_at_its_deadline_and_frees_its_session(tmp_path):
    """The driver alone ends an unread turn: at its rolling deadline on the clock, with the
    sentence that came kept once, in the ChatTurn; the lease, the connection's turn and the
    session's lock are given back before the turn says it is done."""
    import threading
    from types import SimpleNamespace

    from fake_clock import FakeClock
    from ovos_bus_client.session import Session
    from test_connection_routing import ready_connection, say

    from hivemind_chat_agent.client.chat_turn import ChatTurn
    from hivemind_chat_agent.client.turn_driver import TurnDriver
    from hivemind_chat_agent.core.outcomes import TurnStatus
    clock = FakeClock()
    conn = ready_connection(tmp_path, clock=clock)
    pool = OneConnection(conn, clock)
    host = Host(pool, conn.config)
    session_lock = SimpleNamespace(lock=threading.Lock())
    session_lock.lock.acquire()              # as the agent holds it from send() on
    driver = TurnDriver(host, "mine", session_lock)
    turn = driver.turn = ChatTurn("mine", "hello", "en-US")
    driver.send(Session("mine"), "hello")
    tag = driver.handle.turn.tag
    clock.call_later(8, lambda: say(conn, "still thinking", tag))
    driver.adopt()
    driver.run()                             # nobody iterates: only the clock moves it
    assert clock.now() == 8 + conn.config.timeout
    assert turn.status is TurnStatus.TIMED_OUT and turn.is_done()
    assert turn.sentences == ["still thinking"] and turn.get_exception() is None
    assert not session_lock.lock.locked() and pool.leases == 0
    assert not conn.turns.is_open("mine")
    say(conn, "too late", tag)               # the hub's late words reach nobody
    assert turn.sentences == ["still thinking"]


def test_a_turn_a_draining_replica_refused_is_sent_again_at_once_and_answered(tmp_path):
    """`complete_intent_failure` with reason "draining" means the turn never ran: the driver
    sends it again by the same id on a new lease (hub_keeps_turns or not), first at once,
    then after DRAINING_PAUSE, 2 x DRAINING_PAUSE ...; the caller sees only the answer."""
    import threading
    from types import SimpleNamespace

    from fake_clock import FakeClock
    from hivemind_bus_client.message import HiveMessage, HiveMessageType
    from ovos_bus_client.message import Message
    from ovos_bus_client.session import Session
    from test_connection_routing import ready_connection, say

    from hivemind_chat_agent.client.chat_turn import ChatTurn
    from hivemind_chat_agent.client.turn_driver import DRAINING_PAUSE, TurnDriver
    from hivemind_chat_agent.core.outcomes import TurnStatus
    from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
    clock = FakeClock()
    conn = ready_connection(tmp_path, clock=clock)
    pool = OneConnection(conn, clock)
    host = Host(pool, conn.config)
    session_lock = SimpleNamespace(lock=threading.Lock())
    session_lock.lock.acquire()
    driver = TurnDriver(host, "mine", session_lock)
    turn = driver.turn = ChatTurn("mine", "hello", "en-US")
    driver.send(Session("mine"), "hello")
    tag = driver.handle.turn.tag

    def bus(msg_type, data):
        conn.on_socket_message(HiveMessage(HiveMessageType.BUS, payload=Message(
            msg_type, data, {"session": {"session_id": "mine"}, TURN_TAG_KEY: tag})))

    def refuse():
        bus("complete_intent_failure", {"reason": "draining", "message": "restarting"})
        bus("ovos.utterance.handled", {"turn_records": True})
    clock.call_later(1, refuse)                          # the first attempt
    clock.call_later(2, refuse)                          # the first resend, sent at 1
    clock.call_later(3 + DRAINING_PAUSE, lambda: (say(conn, "hi there", tag),   # the second
                                                 bus("ovos.utterance.handled", {})))
    driver.adopt()
    driver.run()
    assert turn.status is TurnStatus.ANSWERED and turn.sentences == ["hi there"]
    assert pool.discarded == ["mine", "mine"] and pool.leases == 0
    assert pool.drained == [conn, conn]       # a `host` list tries another hub next
    assert not session_lock.lock.locked()
