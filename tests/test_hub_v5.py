"""ChatAgentProtocol under a genuine hivemind-core 5.x `listen` (protocol v3, Noise, message
policy), with the stock Noise satellite (hivemind-bus-client's HiveMessageBusClient): what only
the 5.x line has. Skipped where the test process itself runs a 4.x hub stack."""
import importlib.metadata
import os
import tempfile
import threading

import pytest

if importlib.metadata.version("hivemind-core").startswith("4."):
    pytest.skip("needs the 5.x line in this venv", allow_module_level=True)

from hivemind_bus_client.client import HiveMessageBusClient  # noqa: E402
from hivemind_bus_client.identity import NodeIdentity  # noqa: E402
from hivemind_bus_client.message import HiveMessage, HiveMessageType  # noqa: E402
from hubs import HubProcess  # noqa: E402
from json_database import JsonStorage  # noqa: E402
from ovos_bus_client.message import Message  # noqa: E402
from waiting import hold_still, wait_until  # noqa: E402

PLUGIN = {"module": "hivemind-chat-agent-plugin",
          "hivemind-chat-agent-plugin": {"engine": "engines:ScriptEngine", "timeout": 2.5}}


@pytest.fixture(scope="module")
def hub():
    h = HubProcess(PLUGIN, generation="5").start()
    yield h
    h.cleanup()


@pytest.fixture(scope="module")
def identity_home():
    return tempfile.mkdtemp(prefix="hm-test-v5-satellite-")


class Satellite:
    """The stock Noise satellite, recording every BUS message it receives."""

    def __init__(self, creds, home):
        identity = NodeIdentity(identity_file=JsonStorage(os.path.join(home, "_identity.json")))
        self.client = HiveMessageBusClient(key=creds.key, password=creds.password,
                                           host="ws://127.0.0.1", port=creds.port,
                                           useragent="stock-satellite", identity=identity)
        self.received, self.queries = [], []
        self.done = threading.Event()
        self.client.connect()
        self.client.on_mycroft("message", self._on_bus)
        self.client.on(HiveMessageType.QUERY, self._on_query)

    def _on_bus(self, raw):
        msg = Message.deserialize(raw) if isinstance(raw, str) else raw
        self.received.append((msg.msg_type, msg.data.get("utterance"),
                              (msg.context.get("session") or {}).get("session_id")))
        if msg.msg_type in ("ovos.utterance.handled", "hive.policy.denied"):
            self.done.set()

    def _on_query(self, message):
        inner = message.payload.payload
        self.queries.append((inner.msg_type, inner.data.get("utterance")))
        if inner.msg_type in ("hive.query.complete", "hive.query.timeout"):
            self.done.set()

    def ask(self, text, topic="recognizer_loop:utterance", session_id="sess-A"):
        self.received.clear()
        self.done.clear()
        self.client.emit(Message(topic, {"utterances": [text]},
                                 {"session": {"session_id": session_id}}))
        assert self.done.wait(5), (topic, text)
        hold_still()             # anything after the end would be a bug
        return [r for r in self.received if r[0] != topic]

    def query(self, text):
        self.queries.clear()
        self.done.clear()
        self.client.emit(HiveMessage(HiveMessageType.QUERY, payload=HiveMessage(
            HiveMessageType.BUS, payload=Message("recognizer_loop:utterance",
                                                 {"utterances": [text], "lang": "en-US"},
                                                 {"session": {"session_id": "q"}}))))
        assert self.done.wait(5), text
        return self.queries

    def close(self):
        self.client.close()


def test_both_utterance_topics_and_many_sessions_on_one_noise_connection(hub, identity_home):
    """Each message's own session is answered under the id the satellite declared: core hands
    the plugin `<namespace>:sess-A`, the plugin keys the engine session by `sess-A` (as on
    4.0), and core's send restores `sess-A` on the wire."""
    sat = Satellite(hub.add_client(name="both-topics"), identity_home)
    try:
        for topic in ("recognizer_loop:utterance", "ovos.utterance.handle"):
            for sid in ("sess-A", "sess-B"):
                answer = sat.ask("whoami", topic=topic, session_id=sid)
                assert [(t, s) for t, _, s in answer] == [("speak", sid),
                                                          ("ovos.utterance.handled", sid)]
                assert answer[0][1].startswith("session sat-") and answer[0][1].endswith(
                    f"-{sid}") and ":" not in answer[0][1]
    finally:
        sat.close()


@pytest.mark.parametrize("topic", ["ovos.utterance.handle", "recognizer_loop:utterance"])
def test_a_client_allowed_one_topic_is_answered_on_it_and_denied_the_other(hub, identity_home,
                                                                          topic):
    other = ({"ovos.utterance.handle", "recognizer_loop:utterance"} - {topic}).pop()
    sat = Satellite(hub.add_client(name="one-topic", allow=[topic]), identity_home)
    try:
        assert [t for t, _, _ in sat.ask("count 2", topic=topic)] == \
            ["speak", "speak", "ovos.utterance.handled"]
        assert [t for t, _, _ in sat.ask("hello", topic=other)] == ["hive.policy.denied"]
    finally:
        sat.close()


def test_query_is_answered_by_natural_language_query(hub, identity_home):
    sat = Satellite(hub.add_client(name="query"), identity_home)
    try:
        assert sat.query("count 3") == [("speak", "sentence 1"), ("speak", "sentence 2"),
                                        ("speak", "sentence 3"), ("hive.query.complete", None)]
        # an engine that fails has no answer: core reports the query as not answered
        assert sat.query("raise")[-1][0] == "hive.query.timeout"
    finally:
        sat.close()


@pytest.mark.hub
def test_sessions_are_released_when_the_connection_closes(identity_home):
    """5.x calls the plugin's on_disconnect callback with the connection: every session it
    used is released (no hive.client.disconnect handler is needed)."""
    from engines import ScriptEngine
    from ovos_bus_client.session import SessionManager

    from hivemind_chat_agent import ChatAgentProtocol
    from hivemind_chat_agent.bridges.local_hub import LocalHub
    protocol = ChatAgentProtocol(config={"engine": "engines:ScriptEngine"},
                                 engine=ScriptEngine())
    hub = LocalHub(protocol).start()
    try:
        sat = Satellite(hub.add_client(name="release"), identity_home)
        for i in range(5):
            sat.ask("hello", session_id=f"rel-{i}")
        assert len(protocol.satellites) == 5
        kept = [sid for sid in SessionManager.sessions if sid.endswith(
            tuple(f"-rel-{i}" for i in range(5)))]
        assert len(kept) == 5
        sat.close()
        wait_until(lambda: not len(protocol.satellites), 5)
        assert len(protocol.satellites) == 0 and hub.protocol.clients == {}
        assert not [sid for sid in kept if sid in SessionManager.sessions]
    finally:
        protocol.shutdown()
        hub.stop()


def test_plain_frames_never_reach_the_plugin(hub):
    """Someone with only the access key gets HELLO and HANDSHAKE, then core closes on the
    first clear frame: the plugin never sees it (on 4.0 the plugin itself refuses it)."""
    import base64
    import json

    import websocket
    creds = hub.add_client(name="key-only")
    auth = base64.b64encode(f"intruder:{creds.key}".encode()).decode()
    ws = websocket.create_connection(f"ws://127.0.0.1:{creds.port}/?authorization={auth}",
                                     timeout=5)
    try:
        ws.recv(), ws.recv()
        ws.send(json.dumps({"msg_type": "bus", "payload": {
            "type": "recognizer_loop:utterance", "data": {"utterances": ["hello"]},
            "context": {"session": {"session_id": "intruder"}}}}))
        ws.settimeout(3)
        received = []
        try:
            while ws.connected:
                received.append(ws.recv())
        except websocket.WebSocketConnectionClosedException:
            pass
        assert [r for r in received if r] == [] and not ws.connected   # closed, unanswered
    finally:
        ws.close()


def test_a_clients_queries_are_one_conversation_for_the_engine(hub, identity_home):
    """QUERY carries no session: a client's QUERYs are kept as one conversation, its own."""
    import json
    sat = Satellite(hub.add_client(name="query-history"), identity_home)
    other = Satellite(hub.add_client(name="query-other"), identity_home)
    try:
        assert sat.query("hello")[0] == ("speak", "hello there")
        said = sat.query("history")
        assert json.loads(said[0][1]) == [["user", "hello"], ["assistant", "hello there"]]
        assert json.loads(other.query("history")[0][1]) == []
    finally:
        sat.close()
        other.close()
