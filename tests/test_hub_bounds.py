"""Identifiers a satellite declares are bounded (core/limits.MAX_ID_BYTES, 256 bytes of UTF-8).

Our client refuses a longer session id before it sends anything (IdentifierTooLongError). A
genuine hivemind-bus-client satellite that sends one anyway, or a longer turn id, to a genuine
hub running our plugin gets the turn's end with reason "id_too_long" (a stop: its response
with that reason), the hub logs one short line about it, and the connection goes on being
served. Nothing a satellite sends decides how long a line of the hub's log is."""
import socket
import threading
import time

import pytest
from ovos_bus_client.message import Message

from hubs import HubProcess, plugin_config
from hivemind_chat_agent import HiveMindChatAgent, IdentifierTooLongError
from hivemind_chat_agent.core.limits import MAX_ID_BYTES
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from test_hub_protocol import HUB_GENERATIONS, RawSatellite, send_raw

LONGEST_LOG_LINE = 2000     # characters: far below any of the ids sent here
HUGE = 200_000              # characters of the oversized ids (a 3 MB one did the damage)
PLUGIN = "hivemind-chat-agent-plugin"


class Listener:
    """A TCP port on 127.0.0.1 that counts the connections made to it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self):
        self.sock.close()


def test_the_client_refuses_a_session_id_over_the_bound_before_sending_anything():
    listener = Listener()
    agent = HiveMindChatAgent({"host": "127.0.0.1", "port": listener.port, "key": "k" * 32,
                               "password": "p" * 32, "timeout": 5})
    try:
        for session_id in ("s" * (MAX_ID_BYTES + 1), "é" * (MAX_ID_BYTES // 2 + 1),
                           "x" * 3_000_000):
            started = time.monotonic()
            with pytest.raises(IdentifierTooLongError, match=f"over {MAX_ID_BYTES} bytes") as e:
                agent.get_response("hello", session_id=session_id)
            assert time.monotonic() - started < 0.5
            assert len(str(e.value)) < 300        # it quotes the id's start, not the id
        with pytest.raises(IdentifierTooLongError):
            agent.stop_session("s" * 300)
        time.sleep(0.2)
        assert listener.accepted == 0, "a connection was made for an id it refuses"
        assert agent.sessions.resolve("é" * (MAX_ID_BYTES // 2)) == "é" * (MAX_ID_BYTES // 2)
    finally:
        agent.shutdown()
        listener.close()


# ---- a genuine satellite against a genuine hub with the plugin ----

@pytest.fixture(scope="module", params=HUB_GENERATIONS)
def generation(request):
    return request.param


@pytest.fixture(scope="module")
def bounds_hub(generation):
    hub = HubProcess(plugin_config(timeout=5), generation=generation).start()
    yield hub
    hub.cleanup()


class RecordingSatellite(RawSatellite):
    """A RawSatellite that keeps (type, data) of everything the hub sends it."""

    def __init__(self, creds):
        self.replies = []
        super().__init__(creds)

    def _on_any(self, raw):
        msg = Message.deserialize(raw) if isinstance(raw, str) else raw
        self.replies.append((msg.msg_type, msg.data))
        super()._on_any(raw)

    def exchange(self, payload, until, wait=10.0):
        """Send one BUS payload as given; the replies up to the first of type `until`."""
        self.replies.clear()
        send_raw(self, payload)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if any(kind == until for kind, _ in self.replies):
                time.sleep(0.3)            # anything after it would be a bug
                return [(k, d) for k, d in self.replies if k != payload["type"]]
            time.sleep(0.02)
        raise AssertionError(f"no {until} within {wait} s: {self.replies}")


def utterance(text, session_id, **context):
    return {"type": "recognizer_loop:utterance", "data": {"utterances": [text]},
            "context": {"session": {"session_id": session_id}, **context}}


def assert_refused(replies, what):
    [(failure, data), (end, _)] = replies
    assert (failure, end) == ("complete_intent_failure", "ovos.utterance.handled"), replies
    assert data["reason"] == "id_too_long", data
    assert what in data["message"] and f"over {MAX_ID_BYTES} bytes" in data["message"], data
    assert len(data["message"]) < 300, data["message"][:300]


def test_oversized_session_and_turn_ids_are_refused_with_the_reason_and_logged_briefly(
        bounds_hub):
    sat = RecordingSatellite(bounds_hub.add_client(name="long-ids"))
    try:
        assert_refused(sat.exchange(utterance("hello", "s" * HUGE), "ovos.utterance.handled"),
                       "session id")
        assert_refused(sat.exchange(utterance("hello", "s" * (MAX_ID_BYTES + 1)),
                                    "ovos.utterance.handled"), "session id")
        assert_refused(sat.exchange(utterance("hello", "kitchen", **{TURN_TAG_KEY: "t" * HUGE}),
                                    "ovos.utterance.handled"), "turn id")
        stop = {"type": "mycroft.stop", "data": {},
                "context": {"session": {"session_id": "s" * HUGE}}}
        [(kind, data)] = sat.exchange(stop, f"{PLUGIN}.stop.response")
        assert kind == f"{PLUGIN}.stop.response", kind
        assert data["result"] is False and data["reason"] == "id_too_long", data
        # at the bound (256 bytes of UTF-8, 128 characters) and on the same connection: served
        at_bound = "é" * (MAX_ID_BYTES // 2)
        answered = sat.exchange(utterance("hello", at_bound, **{TURN_TAG_KEY: "t" * 256}),
                                "ovos.utterance.handled")
        assert [(k, d.get("utterance")) for k, d in answered] == \
            [("speak", "hello there"), ("ovos.utterance.handled", None)]
    finally:
        sat.close()
    log = bounds_hub.logs()
    longest = max(log.splitlines(), key=len)
    assert len(longest) < LONGEST_LOG_LINE, longest[:300]
    refusals = [line for line in log.splitlines() if "over 256 bytes" in line]
    assert len(refusals) == 4, refusals      # one line per refusal
