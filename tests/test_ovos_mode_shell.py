"""hub/ovos_mode.OVOSModeProtocol's shell without sockets: a fake bus (what OvosBus reports) and
a fake IO loop; what the shell writes to a satellite goes through the loop's `add_callback`,
never from the bus thread, and an utterance the bus cannot take gets its typed failure."""
import json
import threading

from ovos_bus_client.message import Message
from waiting import wait_until

from hivemind_chat_agent.hub.ovos_mode import OVOSModeProtocol


class FakeBus:
    """What hub/ovos_bus.OvosBus gives the shell: start, connected, send, close."""

    def __init__(self, url, on_message, on_up, on_down, retry, max_retry):
        self.on_message, self.on_up, self.on_down = on_message, on_up, on_down
        self.connected = threading.Event()
        self.sent = []

    def start(self):
        self.connected.set()
        self.on_up()
        return self

    def send(self, text):
        self.sent.append(json.loads(text))

    def close(self):
        pass


class FakeLoop:
    """Runs callbacks when the test says, on the test's thread (the 'IO loop')."""

    def __init__(self):
        self.callbacks = []

    def add_callback(self, fn, *args):
        self.callbacks.append((fn, args))

    def run(self):
        while self.callbacks:
            fn, args = self.callbacks.pop(0)
            fn(*args)


class FakeSatellite:
    """A 5.x connection object as dialect_v5 sees it."""
    noise_transport = object()
    session_namespace = "0123456789abcdef"

    def __init__(self, peer, key):
        self.peer, self.key = peer, key
        self.written = []
        self.writer_threads = set()

    def send(self, hive_message):
        self.writer_threads.add(threading.get_ident())
        self.written.append(hive_message.payload)


def protocol_with(*satellites):
    protocol = OVOSModeProtocol(config={"mode": "ovos", "connect_wait": 0},
                                bus_factory=FakeBus)
    protocol._secret = b"s" * 32
    protocol.loop = FakeLoop()
    protocol.hm_protocol = type("Core", (), {"clients": {s.peer: s for s in satellites}})()
    return protocol


def utterance(sat, text="hello world"):
    return Message("recognizer_loop:utterance", {"utterances": [text]},
                   {"peer": sat.peer, "source": sat.peer, "destination": "skills",
                    "session": {"session_id": f"{sat.session_namespace}:kitchen"}})


def test_a_reply_is_written_on_the_loop_under_the_declared_session():
    sat = FakeSatellite("sat::a::kitchen", "key-a")
    protocol = protocol_with(sat)
    try:
        protocol.bus.emit(utterance(sat))
        assert wait_until(lambda: protocol.ovos.sent, 5)
        [sent] = protocol.ovos.sent
        ovos_sid = sent["context"]["session"]["session_id"]
        assert ovos_sid.startswith("sat-") and ovos_sid.endswith("-kitchen")
        reply = {"type": "speak", "data": {"utterance": "Hello world"},
                 "context": {"destination": sat.peer, "source": "skills",
                             "session": {"session_id": ovos_sid}}}
        bus_thread = threading.Thread(target=protocol.ovos.on_message,
                                      args=(json.dumps(reply).encode(),))
        bus_thread.start()
        bus_thread.join()
        assert sat.written == []                       # nothing written off the loop
        protocol.loop.run()
        [written] = sat.written
        assert written.msg_type == "speak"
        assert written.context["session"]["session_id"] == "kitchen"
        assert sat.writer_threads == {threading.get_ident()}
    finally:
        protocol.shutdown()


def test_an_utterance_while_the_bus_is_down_gets_a_typed_failure_at_once():
    sat = FakeSatellite("sat::a::kitchen", "key-a")
    protocol = protocol_with(sat)
    try:
        protocol.ovos.connected.clear()
        protocol.ovos.on_down()
        protocol.bus.emit(utterance(sat))
        protocol.loop.run()
        failure, handled = sat.written
        assert failure.msg_type == "complete_intent_failure"
        assert failure.data["reason"] == "backend_unavailable"
        assert handled.msg_type == "ovos.utterance.handled"
        assert handled.context["session"]["session_id"] == "kitchen"
        assert protocol.ovos.sent == []
    finally:
        protocol.shutdown()


def test_another_satellites_reply_is_never_written():
    a, b = FakeSatellite("sat::a::kitchen", "key-a"), FakeSatellite("sat::b::kitchen", "key-b")
    protocol = protocol_with(a, b)
    try:
        protocol.bus.emit(utterance(a))
        protocol.bus.emit(utterance(b))
        assert wait_until(lambda: len(protocol.ovos.sent) == 2, 5)
        a_sid = protocol.ovos.sent[0]["context"]["session"]["session_id"]
        forged = {"type": "speak", "data": {"utterance": "a's secret"},
                  "context": {"destination": b.peer, "session": {"session_id": a_sid}}}
        protocol.ovos.on_message(json.dumps(forged))
        protocol.loop.run()
        assert a.written == [] and b.written == []
    finally:
        protocol.shutdown()
