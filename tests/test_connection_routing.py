"""Which replies a connection hands to a turn, fed straight into it (no socket): the session id
rules of both hub generations and of the 4.13-4.14 hubs that namespace ids without restoring."""
import pytest
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.core.turns import Sentence

CONFIG = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                 "plays_audio": True})


@pytest.fixture
def conn():
    c = HubConnection(CONFIG, Session("mine"), SessionBook("d"))
    yield c
    c._transport.release()


def open_turn(conn, sid, tag):
    return conn.turns.open(sid, tag, 5, check=lambda: None)    # as start_turn, unsent


def speak(conn, text, sid, tag):
    context = {"session": {"session_id": sid}}
    if tag is not None:
        context[TURN_TAG_KEY] = tag
    conn._on_bus(Message("speak", {"utterance": text}, context))


def heard(handle):
    out = []
    while not handle.events.empty():
        event = handle.events.get()
        if isinstance(event, Sentence):
            out.append(event.text)
    return out


def test_a_reply_with_our_tag_but_another_session_never_reaches_the_turn(conn):
    handle = open_turn(conn, "mine", "t1")
    speak(conn, "forged", "someone-else", "t1")
    speak(conn, "forged too", "0123456789abcdef:someone-else", "t1")
    speak(conn, "genuine", "mine", "t1")
    assert heard(handle) == ["genuine"]


def test_a_namespaced_answer_is_ours_and_ends_sharing(conn):
    conn.many_sessions = True
    handle = open_turn(conn, "mine", "t1")
    speak(conn, "namespaced", "0123456789abcdef:mine", "t1")
    assert heard(handle) == ["namespaced"] and not conn.many_sessions


def test_a_shared_connection_takes_every_session_it_carried_and_no_other(conn):
    conn.many_sessions = True
    a, b = open_turn(conn, "a", "ta"), open_turn(conn, "b", "tb")
    speak(conn, "for b", "b", "tb")
    speak(conn, "for a", "a", "ta")
    speak(conn, "for a, untagged", "a", None)
    speak(conn, "never carried", "c", None)
    assert heard(a) == ["for a", "for a, untagged"] and heard(b) == ["for b"]


def test_an_untagged_namespaced_reply_is_ours_only_under_our_own_prefix(conn):
    handle = open_turn(conn, "mine", "t1")
    speak(conn, "someone's", "fedcba9876543210:mine", None)    # prefix not seen yet: no
    speak(conn, "tagged", "0123456789abcdef:mine", "t1")        # our turn shows our prefix
    speak(conn, "untagged, ours", "0123456789abcdef:mine", None)
    speak(conn, "untagged, another prefix", "fedcba9876543210:mine", None)
    assert heard(handle) == ["tagged", "untagged, ours"]


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


def test_the_first_speaker_is_told_once():
    """The agent relaxes its churn gate when the hub answers through our plugin."""
    told = []
    c = HubConnection(CONFIG, Session("mine"), SessionBook("d"), on_speaker=told.append)
    try:
        handle = open_turn(c, "mine", "t1")
        for _ in range(2):
            c._on_bus(Message("speak", {"utterance": "hi",
                                        "meta": {"skill": "hivemind-chat-agent-plugin"}},
                              {"session": {"session_id": "mine"}, TURN_TAG_KEY: "t1"}))
        assert heard(handle) == ["hi", "hi"] and told == ["hivemind-chat-agent-plugin"]
    finally:
        c._transport.release()


def test_a_send_that_races_the_hubs_pin_refusal_raises_the_refusal():
    """A 5.x hub checks our static key only after the last handshake message: the transport
    has dropped the channel, but the socket thread has not yet read the close (a clean-clone
    CI run raised "refusing to send before the connection is encrypted" instead of the fix)."""
    import threading
    from hivemind_chat_agent.errors import ClientKeyRefusedError
    c = HubConnection(CONFIG, Session("mine"), SessionBook("d"))
    c._ready.set()                # the client's side of the handshake finished
    c.many_sessions = True        # a v3 channel, since dropped by the transport
    late_close = threading.Timer(0.2, c._transport.on_close, (None, 1008, "invalid message"))
    late_close.start()
    try:
        with pytest.raises(ClientKeyRefusedError, match="reset-noise-pin"):
            c.start_turn(Session("mine"), "hello", "t1", timeout=5)
    finally:
        late_close.cancel()
        c._transport.release()
