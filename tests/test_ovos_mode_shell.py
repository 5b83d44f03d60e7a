"""hub/ovos_mode.OVOSModeProtocol's shell without sockets: a fake bus (what OvosBus reports) and
a fake IO loop; what the shell writes to a satellite goes through the loop's `add_callback`,
never from the bus thread, and an utterance the bus cannot take gets its typed failure."""
import json
import threading

from ovos_bus_client.message import Message
from waiting import wait_until

from hivemind_chat_agent.core.skills_readiness import PROBE_TYPE
from hivemind_chat_agent.hub.ovos_bus import BusNotConnected
from hivemind_chat_agent.hub.ovos_mode import OVOSModeProtocol


class FakeBus:
    """What hub/ovos_bus.OvosBus gives the shell: start, connected, send, close."""

    def __init__(self, url, on_message, on_up, on_down, retry, max_retry):
        self.on_message, self.on_up, self.on_down = on_message, on_up, on_down
        self.connected = threading.Event()
        self.sent = []
        self.skills_ready = True

    def start(self):
        self.connected.set()
        self.on_up()
        return self

    def send(self, text):
        if not self.connected.is_set():
            raise BusNotConnected("down")
        message = json.loads(text)
        if message["type"] == PROBE_TYPE:     # answered as ProcessStatus does, once ready
            if self.skills_ready:
                self.on_message(json.dumps({"type": PROBE_TYPE + ".response",
                                            "data": {"status": True},
                                            "context": {"destination": ["hivemind"]}}).encode())
            return
        self.sent.append(message)

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


def protocol_with(*satellites, **config):
    protocol = OVOSModeProtocol(config={"mode": "ovos", "connect_wait": 0, **config},
                                bus_factory=FakeBus)
    protocol._secret = b"s" * 32
    protocol.loop = FakeLoop()     # the thread here runs no loop: the plugin's own is used
    protocol.own_loop.get = lambda: protocol.loop
    assert wait_until(lambda: protocol.routes.bus_up, 5)    # the skills answered the probe
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


def test_a_transport_thread_with_no_loop_gets_its_replies_on_the_plugins_own_loop():
    """As hivemind-mqtt-protocol and hivescope deliver: no loop runs on the thread a satellite's
    message comes in on. Before reply_loops, the shell took tornado's IOLoop.current() there, a
    loop nobody runs, and the satellite heard nothing."""
    sat = FakeSatellite("sat::a::kitchen", "key-a")
    protocol = OVOSModeProtocol(config={"mode": "ovos", "connect_wait": 0}, bus_factory=FakeBus)
    protocol._secret = b"s" * 32
    protocol.hm_protocol = type("Core", (), {"clients": {sat.peer: sat}})()
    assert wait_until(lambda: protocol.routes.bus_up, 5)
    try:
        transport = threading.Thread(target=protocol.bus.emit, args=(utterance(sat),))
        transport.start()
        transport.join()
        assert wait_until(lambda: protocol.ovos.sent, 5)
        ovos_sid = protocol.ovos.sent[0]["context"]["session"]["session_id"]
        reply = {"type": "speak", "data": {"utterance": "Hello world"},
                 "context": {"destination": sat.peer, "session": {"session_id": ovos_sid}}}
        protocol.ovos.on_message(json.dumps(reply).encode())
        assert wait_until(lambda: sat.written, 5)
        [written] = sat.written
        assert written.data["utterance"] == "Hello world"
        [writer] = sat.writer_threads
        assert writer not in (transport.ident, threading.get_ident())
    finally:
        protocol.shutdown()
    assert wait_until(lambda: not any(t.name == "hivemind-chat-ovos-replies"
                                      for t in threading.enumerate()), 5)   # stopped with it


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


# ---- QUERY / CASCADE (hivemind-core calls answer_query on a worker of its own) ----
class Query(threading.Thread):
    """answer_query consumed as hivemind-core consumes it, on a thread of its own."""

    def __init__(self, protocol, text="hello world", client=None):
        super().__init__(daemon=True)
        self.protocol, self.text, self.client, self.said = protocol, text, client, []
        self.start()

    def run(self):
        for sentence in self.protocol.answer_query(self.text, "en-US", self.client):
            self.said.append(sentence)
            if sentence is None:
                return


def sent_of_type(protocol, msg_type):
    return [m for m in protocol.ovos.sent if m["type"] == msg_type]


def test_a_query_streams_what_ovos_speaks_for_it_until_handled():
    sat = FakeSatellite("sat::a::kitchen", "key-a")
    protocol = protocol_with(sat)
    try:
        query = Query(protocol)
        assert wait_until(lambda: protocol.ovos.sent, 5)
        [asked] = protocol.ovos.sent
        qid = asked["context"]["query_id"]
        assert asked["type"] == "recognizer_loop:utterance"
        assert asked["data"] == {"utterances": ["hello world"], "lang": "en-US"}
        assert asked["context"]["session"]["session_id"] == qid and ":" not in qid
        reply = {"context": {"query_id": qid, "session": {"session_id": qid}}}
        speak = dict(reply, type="speak", data={"utterance": "Hello world"})
        twin = {"type": "speak", "data": {"utterance": "Hello world"},
                "context": dict(reply["context"], _namespace_compat_twin=True)}
        for message in (speak, twin, dict(reply, type="ovos.utterance.handled", data={})):
            protocol.ovos.on_message(json.dumps(message).encode())
        query.join(5)
        assert query.said == ["Hello world", None]
        [audio_end] = sent_of_type(protocol, "recognizer_loop:audio_output_end")[:1]
        assert audio_end["context"]["session"]["session_id"] == qid   # wait=True skills go on
        protocol.loop.run()
        assert sat.written == []                 # nothing of a query reaches a satellite
        assert not protocol.queries.pending()
    finally:
        protocol.shutdown()


def test_a_query_ovos_never_finishes_ends_after_the_query_timeout():
    protocol = protocol_with(query_timeout=0.2)
    try:
        query = Query(protocol)
        query.join(5)
        assert query.said == [None] and not protocol.queries.pending()
    finally:
        protocol.shutdown()


def test_a_query_is_declined_at_once_while_the_bus_is_down():
    protocol = protocol_with()
    try:
        protocol.ovos.connected.clear()
        query = Query(protocol)
        query.join(5)
        assert query.said == [None] and protocol.ovos.sent == []
    finally:
        protocol.shutdown()


class FakeChain:
    """hivemind-core 5.x's policy chain as answer_query uses it: review() applies the
    mutations of an allowed message to it (hivemind_core/policy.py)."""

    def __init__(self, deny=False):
        self.deny = deny

    def review(self, message, client):
        from hivemind_plugin_manager import Verdict
        if self.deny:
            return Verdict.deny("policy_error", "no")
        message.context["session"]["blacklisted_skills"] = ["skill-secret"]
        return Verdict.allow()


def test_a_query_carries_the_clients_policy_and_a_denied_one_never_reaches_ovos():
    protocol = protocol_with()
    try:
        protocol.hm_protocol.policy_chain = FakeChain()
        Query(protocol, client=object())
        assert wait_until(lambda: protocol.ovos.sent, 5)
        session = protocol.ovos.sent[0]["context"]["session"]
        assert session["blacklisted_skills"] == ["skill-secret"]
        assert session["session_id"] == protocol.ovos.sent[0]["context"]["query_id"]
        protocol.hm_protocol.policy_chain = FakeChain(deny=True)
        denied = Query(protocol, client=object())
        denied.join(5)
        assert denied.said == [None] and len(protocol.ovos.sent) == 1
    finally:
        protocol.shutdown()


# ---- ovos-core's skills asked after each connect (core/skills_readiness.py) ----
def test_utterances_are_refused_until_the_skills_answer_then_forwarded():
    """The bus is up before ovos-core is (a bus restart, the hub's start): an utterance is
    told at once why, not forwarded to nobody; once the skills answer the probe it goes."""
    sat = FakeSatellite("sat::a::kitchen", "key-a")
    protocol = OVOSModeProtocol(config={"mode": "ovos", "connect_wait": 0},
                                bus_factory=lambda *a, **k: NotReadyBus(*a, **k))
    protocol._secret = b"s" * 32
    protocol.loop = FakeLoop()
    protocol.own_loop.get = lambda: protocol.loop
    protocol.hm_protocol = type("Core", (), {"clients": {sat.peer: sat}})()
    try:
        assert wait_until(lambda: protocol.ovos.probes >= 2, 5)      # asked again, unanswered
        protocol.bus.emit(utterance(sat))
        protocol.loop.run()
        failure, handled = sat.written
        assert failure.data["reason"] == "backend_unavailable"
        assert "skills are not on the hub's OVOS messagebus yet" in failure.data["message"]
        assert protocol.ovos.sent == []
        protocol.ovos.skills_ready = True
        assert wait_until(lambda: protocol.routes.bus_up, 5)
        protocol.bus.emit(utterance(sat, "hello again"))
        assert wait_until(lambda: protocol.ovos.sent, 5)
        assert protocol.ovos.sent[0]["data"]["utterances"] == ["hello again"]
        protocol.ovos.connected.clear()
        protocol.ovos.on_down()                  # lost: asked again after the next connect
        protocol.ovos.skills_ready = False
        protocol.ovos.connected.set()
        protocol.ovos.on_up()
        assert not protocol.routes.bus_up
        assert wait_until(lambda: protocol.ovos.probes >= 4, 5)
    finally:
        protocol.shutdown()


def test_a_bus_without_ovos_core_skills_can_be_taken_at_once():
    sat = FakeSatellite("sat::a::kitchen", "key-a")
    protocol = OVOSModeProtocol(config={"mode": "ovos", "connect_wait": 0,
                                        "wait_for_skills": False},
                                bus_factory=lambda *a, **k: NotReadyBus(*a, **k))
    protocol._secret = b"s" * 32
    protocol.hm_protocol = type("Core", (), {"clients": {sat.peer: sat}})()
    try:
        assert protocol.routes.bus_up
        protocol.bus.emit(utterance(sat))
        assert wait_until(lambda: protocol.ovos.sent, 5)
        assert protocol.ovos.probes == 0
    finally:
        protocol.shutdown()


class NotReadyBus(FakeBus):
    """ovos-messagebus with no ovos-core on it yet: nobody answers the probe until told."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.skills_ready = False
        self.probes = 0

    def send(self, text):
        if json.loads(text)["type"] == PROBE_TYPE:
            self.probes += 1
        super().send(text)
