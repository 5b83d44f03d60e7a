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
from hubs import HubProcess, plugin_config
from ovos_bus_client.message import Message
from raw_satellite import HUB_GENERATIONS, RawSatellite, send_raw
from waiting import UNIT, hold_still, wait_until

from hivemind_chat_agent import HiveMindChatAgent, IdentifierTooLongError
from hivemind_chat_agent.core.limits import MAX_ID_BYTES
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY

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
            assert time.monotonic() - started < 2 * UNIT   # at once, not after a timeout
            assert len(str(e.value)) < 300        # it quotes the id's start, not the id
        with pytest.raises(IdentifierTooLongError):
            agent.stop_session("s" * 300)
        hold_still()                 # a connection attempt would have been made by now
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
    """A RawSatellite that keeps (type, data) of everything the hub sends it; `hello_session`
    is the session id its HELLO declares (the library's own random one by default)."""

    def __init__(self, creds, hello_session=None):
        self.replies = []
        if hello_session is None:
            super().__init__(creds)
        else:
            self._connect_declaring(creds, hello_session)

    def _connect_declaring(self, creds, session_id):
        from hivemind_bus_client.client import HiveMessageBusClient
        from ovos_bus_client.session import Session
        from ovos_utils.fakebus import FakeBus
        from raw_satellite import satellite_identity
        self.client = HiveMessageBusClient(
            key=creds.key, password=creds.password, host="ws://127.0.0.1", port=creds.port,
            useragent="long-hello", identity=satellite_identity(),
            internal_bus=FakeBus(session=Session(session_id)))
        self.received, self.handled = [], threading.Event()
        self.client.connect()
        self.client.on_mycroft("message", self._on_any)

    def _on_any(self, raw):
        msg = Message.deserialize(raw) if isinstance(raw, str) else raw
        self.replies.append((msg.msg_type, msg.data))
        super()._on_any(raw)

    def exchange(self, payload, until, wait=10.0):
        """Send one BUS payload as given; the replies up to the first of type `until`."""
        self.replies.clear()
        send_raw(self, payload)
        if wait_until(lambda: any(kind == until for kind, _ in self.replies), wait):
            hold_still()                   # anything after it would be a bug
            return [(k, d) for k, d in self.replies if k != payload["type"]]
        raise AssertionError(f"no {until} within {wait} s: {str(self.replies)[:500]}")


def utterance(text, session_id, **context):
    return {"type": "recognizer_loop:utterance", "data": {"utterances": [text]},
            "context": {"session": {"session_id": session_id}, **context}}


def stop(session_id):
    return {"type": "mycroft.stop", "data": {}, "context": {"session": {"session_id": session_id}}}


def assert_refused(replies, what):
    [(failure, data), (end, _)] = replies
    assert (failure, end) == ("complete_intent_failure", "ovos.utterance.handled"), replies
    assert data["reason"] == "id_too_long", data
    assert what in data["message"] and f"over {MAX_ID_BYTES} bytes" in data["message"], data
    assert len(data["message"]) < 300, data["message"][:300]


def assert_stop_refused(replies):
    [(kind, data)] = replies
    assert kind == f"{PLUGIN}.stop.response", kind
    assert data["result"] is False and data["reason"] == "id_too_long", data


def plugin_lines(log):
    return [line for line in log.splitlines() if "hivemind_chat_agent" in line]


def assert_briefly_logged(lines, refusals, naming=""):
    """No line over LONGEST_LOG_LINE; one per refusal (of an id that begins with `naming`)."""
    longest = max(lines, key=len)
    assert len(longest) < LONGEST_LOG_LINE, longest[:300]
    said = {line for line in lines if f"over {MAX_ID_BYTES} bytes" in line and
            f"'{naming}" in line}     # (the hub's output and its log file hold the same lines)
    assert len(said) == refusals, "\n".join(said)


def test_oversized_ids_in_a_message_are_refused_with_the_reason_and_logged_briefly(bounds_hub):
    """5.x hands the plugin the session id a message declares; 4.0 replaces it with the
    HELLO's (the next test). A turn id over the bound is refused on both."""
    v5 = bounds_hub.generation != "4.0"
    sat = RecordingSatellite(bounds_hub.add_client(name="long-ids"))
    try:
        if v5:
            assert_refused(sat.exchange(utterance("hello", "s" * HUGE),
                                        "ovos.utterance.handled"), "session id")
            assert_refused(sat.exchange(utterance("hello", "s" * (MAX_ID_BYTES + 1)),
                                        "ovos.utterance.handled"), "session id")
            assert_stop_refused(sat.exchange(stop("s" * HUGE), f"{PLUGIN}.stop.response"))
        for turn_id in ("t" * HUGE, "é" * (MAX_ID_BYTES // 2 + 1)):
            assert_refused(sat.exchange(utterance("hello", "kitchen", **{TURN_TAG_KEY: turn_id}),
                                        "ovos.utterance.handled"), "turn id")
        # at the bound (256 bytes of UTF-8) and on the same connection: served
        at_bound = "é" * (MAX_ID_BYTES // 2)
        answered = sat.exchange(utterance("hello", at_bound if v5 else "kitchen",
                                          **{TURN_TAG_KEY: at_bound}), "ovos.utterance.handled")
        assert [(k, d.get("utterance")) for k, d in answered] == \
            [("speak", "hello there"), ("ovos.utterance.handled", None)]
    finally:
        sat.close()
    # hivemind-core 4.0's websocket plugin logs every message it receives, whole, at INFO:
    # there only the plugin's own lines can be held to the bound
    log = bounds_hub.logs()
    assert_briefly_logged(log.splitlines() if v5 else plugin_lines(log), 5 if v5 else 2)


def test_a_session_id_over_the_bound_declared_in_the_hello_is_refused(bounds_hub):
    """The id the satellite's HELLO declares, which 4.0 puts on each of its messages and
    5.x gives messages that declare none. hivemind-core itself names the connection by it
    in its INFO lines (upstream; our client never declares one this long)."""
    sid = "h" * HUGE
    sat = RecordingSatellite(bounds_hub.add_client(name="long-hello"), hello_session=sid)
    try:
        # connect() returned after the library sent its HELLO (it sets handshake_event
        # after the send), and one socket keeps the order: no wait before the utterance
        assert_refused(sat.exchange(utterance("hello", sid), "ovos.utterance.handled"),
                       "session id")
        assert_stop_refused(sat.exchange(stop(sid), f"{PLUGIN}.stop.response"))
    finally:
        sat.close()
    assert_briefly_logged(plugin_lines(bounds_hub.logs()), 2, naming="h" * 32)
