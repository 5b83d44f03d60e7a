"""Which replies a connection hands to a turn, fed straight into it (no socket): the session id
rules of both hub generations and of the 4.13-4.14 hubs that namespace ids without restoring."""
import time

import pytest
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection, TurnHandle
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from hivemind_chat_agent.core.sessions import SessionBook
from hivemind_chat_agent.core.turns import Sentence, Turn

CONFIG = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                 "plays_audio": True})


@pytest.fixture
def conn():
    c = HubConnection(CONFIG, Session("mine"), SessionBook("d"))
    yield c
    c._transport.release()


def open_turn(conn, sid, tag):
    handle = TurnHandle(Turn(session_id=sid, tag=tag, timeout=5, started_at=time.monotonic()))
    with conn._lock:
        conn._table.open(handle.turn)
        conn._handles[sid] = handle
        conn._tags[tag] = sid
        conn._carried[sid] = None
    return handle


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
