"""Which replies a connection hands to a turn (CarriedTurns, fed straight), the session id rules
of both hub generations and of the 4.13-4.14 hubs that namespace ids without restoring; and the
connection's shell fed as its transport feeds it, over a real in-memory Noise handshake."""
import threading

import pytest
from fake_clock import FakeClock
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session

from hivemind_chat_agent.client.carried_turns import CarriedTurns
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from hivemind_chat_agent.core.replies import parse_reply


class Heard:
    """A turn's sink (client/carried_turns.TurnSink) that keeps what reached it."""

    def __init__(self):
        self.sentences, self.stopped_by, self.outcome = [], [], None

    def add_sentence(self, text):
        self.sentences.append(text)

    def hub_stopped(self, skill_id):
        self.stopped_by.append(skill_id)

    def end(self, outcome):
        self.outcome = outcome


def open_turn(turns, sid="mine", tag="t1", timeout=5):
    """A turn opened as start_turn opens it (unsent), with a `Heard` sink as `handle.sink`."""
    return turns.open(sid, tag, timeout, Heard(), check=lambda: None)


class Carried:
    """A connection's turns (CarriedTurns) as the connection feeds them, socket-free."""

    def __init__(self, own_id="mine", many_sessions=False, clock=None):
        self.turns = CarriedTurns(SessionBook("d"), clock or FakeClock(), 100)
        self.own_id, self.many_sessions = own_id, many_sessions

    def open(self, sid, tag):
        return open_turn(self.turns, sid, tag)

    def speak(self, text, sid, tag):
        context = {"session": {"session_id": sid}}
        if tag is not None:
            context[TURN_TAG_KEY] = tag
        reply, _ = parse_reply("speak", {"utterance": text}, context)
        _, _, unshare = self.turns.route(reply, self.own_id, self.many_sessions)
        if unshare:
            self.many_sessions = False


@pytest.fixture
def conn():
    return Carried()


def heard(handle):
    return handle.sink.sentences


def test_a_reply_with_our_tag_but_another_session_never_reaches_the_turn(conn):
    handle = conn.open("mine", "t1")
    conn.speak("forged", "someone-else", "t1")
    conn.speak("forged too", "0123456789abcdef:someone-else", "t1")
    conn.speak("genuine", "mine", "t1")
    assert heard(handle) == ["genuine"]


def test_a_namespaced_answer_is_ours_and_ends_sharing(conn):
    conn.many_sessions = True
    handle = conn.open("mine", "t1")
    conn.speak("namespaced", "0123456789abcdef:mine", "t1")
    assert heard(handle) == ["namespaced"] and not conn.many_sessions


def test_a_shared_connection_takes_every_session_it_carried_and_no_other(conn):
    conn.many_sessions = True
    a, b = conn.open("a", "ta"), conn.open("b", "tb")
    conn.speak("for b", "b", "tb")
    conn.speak("for a", "a", "ta")
    conn.speak("for a, untagged", "a", None)
    conn.speak("never carried", "c", None)
    assert heard(a) == ["for a", "for a, untagged"] and heard(b) == ["for b"]


def test_an_untagged_namespaced_reply_is_ours_only_under_our_own_prefix(conn):
    handle = conn.open("mine", "t1")
    conn.speak("someone's", "fedcba9876543210:mine", None)    # prefix not seen yet: no
    conn.speak("tagged", "0123456789abcdef:mine", "t1")        # our turn shows our prefix
    conn.speak("untagged, ours", "0123456789abcdef:mine", None)
    conn.speak("untagged, another prefix", "fedcba9876543210:mine", None)
    assert heard(handle) == ["tagged", "untagged, ours"]


def test_a_turn_times_out_on_its_clock_and_every_sentence_rolls_the_deadline():
    """The driver's wait, on a fake clock: a sentence at 8 s of a 10 s timeout moves the end
    to 18 s, where the turn times out with that sentence kept."""
    from hivemind_chat_agent.client.turn_driver import until_end
    from hivemind_chat_agent.core.turns import Progress
    clock = FakeClock()
    c = Carried(clock=clock)
    handle = open_turn(c.turns, timeout=10)
    clock.call_later(8, lambda: c.speak("still thinking", "mine", "t1"))
    ended = until_end(handle, lambda: c.turns.expire(handle), clock)
    assert heard(handle) == ["still thinking"] and ended.state is Progress.TIMED_OUT
    assert clock.now() == 18


def test_the_audio_end_is_repeated_at_growing_gaps_until_the_turn_ends():
    """ovos-core may subscribe to the audio end after our report (a skill's
    wait_while_speaking checks, then listens): repeats while the turn is open cover a late
    listener, once per session however many sentences came, and stop once the turn is over."""
    from fake_clock import FakeClock

    from hivemind_chat_agent.client.satellite_reports import SatelliteReports
    from hivemind_chat_agent.compat import register_session
    clock, sent, open_turns = FakeClock(), [], {"mine"}
    reports = SatelliteReports(
        emit=lambda m: sent.append((round(clock.now(), 6), m.context[TURN_TAG_KEY])),
        wire=lambda sess: sess.serialize(), source="me", turn_open=open_turns.__contains__,
        usable=lambda: True, clock=clock)
    register_session(Session("mine"))
    for _ in range(3):             # three sentences at once: one report each, one repeat chain
        reports.audio_end("mine", "t1")
        reports.echo_later("mine", "t1")
    clock.advance(3.0)
    assert sent == [(0.0, "t1")] * 3 + [(0.25, "t1"), (0.75, "t1"), (1.75, "t1"), (2.75, "t1")]
    open_turns.clear()             # the turn is over: the next repeat is not sent, nor another
    clock.advance(5.0)
    assert len(sent) == 7 and clock.pending == 0


class RecordingTransport:
    """The socket layer as HubConnection sees it, recording what would be sent; `refuse`
    makes a send fail as the transport does once the hub dropped the channel, and
    `then_closed` (code, reason) has the socket thread read the hub's close `CLOSE_LAG` after
    that refusal, as it does in the field."""

    CLOSE_LAG = 0.1
    """Seconds between the refused send and the socket thread's close: the race played, not a
    wait: the close lands while the caller waits for it (at most 1 s), which is the path under
    test; started by the refusal, it can never come before the send."""

    def __init__(self, owner, config, useragent):
        self.owner, self.sent, self.channel, self.refuse = owner, [], None, None
        self.then_closed, self.closing = None, None

    def emit(self, message):
        if self.refuse is not None:
            if self.then_closed is not None and self.closing is None:
                self.closing = threading.Timer(self.CLOSE_LAG, self.owner.on_socket_close,
                                               self.then_closed)
                self.closing.daemon = True
                self.closing.start()
            raise self.refuse
        self.sent.append(message)

    def stop(self):
        pass

    def release(self):
        pass


class RecordingTransports:
    """A `transport=` factory for HubConnection that keeps the RecordingTransports it made,
    so a test reaches its connection's socket layer without reading the connection's
    privates."""

    def __init__(self):
        self.made = []

    def __call__(self, owner, config, useragent):
        self.made.append(RecordingTransport(owner, config, useragent))
        return self.made[-1]

    @property
    def last(self) -> RecordingTransport:
        return self.made[-1]


def ready_connection(tmp_path, transports=None, **kw):
    """A HubConnection whose link went through a real Noise handshake with the hub side of
    the library, fed as Transport feeds it; its socket layer is `transports.last`."""
    from test_handshakes import HELLO_5, OFFER_5, NoiseHub
    config = ClientConfig.from_dict({"host": "127.0.0.1", "key": "key-1", "password":
                                     "correct horse battery staple", "plays_audio": True,
                                     "noise_key_dir": str(tmp_path / "keys")})
    transports = transports if transports is not None else RecordingTransports()
    c = HubConnection(config, Session("mine"), SessionBook("d"), transport=transports, **kw)
    hub = NoiseHub(tmp_path)
    c.on_socket_open()
    c.on_socket_message(HiveMessage(HiveMessageType.HELLO, HELLO_5))
    c.on_socket_message(HiveMessage(HiveMessageType.HANDSHAKE, OFFER_5))
    c.on_socket_message(HiveMessage(HiveMessageType.HANDSHAKE,
                                    hub.answer(transports.last.sent[-1])))
    assert c.alive and c.many_sessions
    return c


def say(c, text, tag="t1", meta=None):
    c.on_socket_message(HiveMessage(HiveMessageType.BUS, payload=Message(
        "speak", {"utterance": text, "meta": meta or {}},
        {"session": {"session_id": "mine"}, TURN_TAG_KEY: tag})))


def test_the_first_speaker_is_told_once(tmp_path):
    """The agent relaxes its churn gate when the hub answers through our plugin."""
    told = []
    c = ready_connection(tmp_path, on_speaker=told.append)
    handle = open_turn(c.turns)
    for _ in range(2):
        say(c, "hi", meta={"skill": "hivemind-chat-agent-plugin"})
    assert heard(handle) == ["hi", "hi"] and told == ["hivemind-chat-agent-plugin"]


def test_a_send_that_races_the_hubs_pin_refusal_raises_the_refusal(tmp_path):
    """A 5.x hub checks our static key only after the last handshake message: the transport
    has dropped the channel, but the socket thread has not yet read the close (a clean-clone
    CI run raised "refusing to send before the connection is encrypted" instead of the fix)."""
    from hivemind_chat_agent.errors import ClientKeyRefusedError, ConnectionLostError
    transports = RecordingTransports()
    c = ready_connection(tmp_path, transports)
    socket = transports.last
    socket.refuse = ConnectionLostError("refusing to send before the connection is encrypted")
    socket.then_closed = (1008, "invalid message")
    with pytest.raises(ClientKeyRefusedError, match="reset-noise-pin"):
        c.start_turn(Session("mine"), "hello", "t1", timeout=5, sink=Heard())
    assert socket.closing is not None       # the close came after the refused send
    socket.closing.join(5)


def test_a_tampered_frame_ends_the_turns_as_lost_and_closes(tmp_path):
    from hivemind_chat_agent.core.frames import Opened, Verdict
    from hivemind_chat_agent.core.turns import Progress
    c = ready_connection(tmp_path)
    handle = open_turn(c.turns)
    c.on_socket_untrusted(Opened(Verdict.TAMPERED, why="bad tag"))
    ended = handle.wait_end(FakeClock(), 0)
    assert ended is not None and ended.state is Progress.LOST
    assert not c.alive


def test_an_answer_to_an_open_question_waits_for_the_skill_to_listen_on_the_clock():
    """The wait a connection makes before it sends a turn (start_turn): until the asking
    skill's `get_response.waiting`, or TurnTable.LISTEN_WITHIN after the question when it
    never comes; none at all without a question."""
    from hivemind_chat_agent.core.turns import TurnTable

    def route(c, msg_type, data, tag):
        reply, _ = parse_reply(msg_type, data, {"session": {"session_id": "mine"},
                                                TURN_TAG_KEY: tag})
        c.turns.route(reply, c.own_id, c.many_sessions)

    def asked(clock):
        c = Carried(clock=clock)
        question = c.open("mine", "t1")
        route(c, "skill.converse.get_response.enable", {"skill_id": "alerts"}, "t1")
        route(c, "speak", {"utterance": "what time?", "expect_response": True}, "t1")
        c.turns.finish(question)
        return c

    clock = FakeClock()
    c = Carried(clock=clock)
    c.turns.wait_for_listener("mine")
    assert clock.now() == 0                                   # no question: at once
    c = asked(clock)
    clock.call_later(0.3, lambda: route(c, "alerts.get_response.waiting", {}, "t1"))
    c.turns.wait_for_listener("mine")
    assert clock.now() == 0.3                                 # the skill listens: at once
    c.turns.wait_for_listener("mine")
    assert clock.now() == 0.3
    c = asked(clock)                                          # asked at 0.3, never listens
    # no turn runs, but the skill still waits for the question's audio end: it is repeated
    assert not c.turns.is_open("mine") and c.turns.awaits_audio_end("mine")
    c.turns.wait_for_listener("mine")
    assert clock.now() == 0.3 + TurnTable.LISTEN_WITHIN
    route(c, "alerts.get_response.waiting", {}, "t1")
    assert not c.turns.awaits_audio_end("mine")
    c = asked(clock)                      # the connection is lost while the answer waits:
    started = clock.now()                 # the wait ends with it, not LISTEN_WITHIN later
    clock.call_later(0.2, lambda: c.turns.lose_all("the hub went away"))
    c.turns.wait_for_listener("mine")
    assert clock.now() == started + 0.2
