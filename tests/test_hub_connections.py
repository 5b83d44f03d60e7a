"""The hub plugin follows each satellite *connection*, not the name hivemind-core files it
under: on 5.x a HELLO renames a live connection (`ua::id::name::session`), and a turn asked
under the old name is still that connection's. A turn whose satellite left before it ran ends
in one place, under its lock, and leaves nothing behind. Embedded 5.x hub (LocalHub), a stock
hivemind-bus-client satellite."""
import threading

import pytest
from engines import ScriptEngine
from hivemind_bus_client.client import HiveMessageBusClient
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from raw_satellite import satellite_identity
from waiting import wait_until

from hivemind_chat_agent import ChatAgentProtocol
from hivemind_chat_agent.bridges.local_hub import LocalHub

pytestmark = pytest.mark.hub


@pytest.fixture
def plugin():
    protocol = ChatAgentProtocol(config={"engine": "engines:ScriptEngine"},
                                 engine=ScriptEngine())
    yield protocol
    protocol.shutdown()


@pytest.fixture
def hub(plugin):
    local = LocalHub(plugin).start()
    yield local
    local.stop()


def connect(hub, name):
    creds = hub.add_client(name=name)
    client = HiveMessageBusClient(key=creds.key, password=creds.password, host="ws://127.0.0.1",
                                  port=hub.port, useragent=name, identity=satellite_identity())
    client.connect()
    return client


def test_a_hello_while_turns_are_in_flight_drops_none_of_their_answers(hub):
    client = connect(hub, "rehello")
    answers, handled, lock = {}, set(), threading.Lock()

    def on_speak(message):
        with lock:
            answers[message.context["session"]["session_id"]] = message.data["utterance"]

    def on_handled(message):
        with lock:
            handled.add(message.context["session"]["session_id"])
    client.on_mycroft("speak", on_speak)
    client.on_mycroft("ovos.utterance.handled", on_handled)
    sessions = [f"inflight-{i}" for i in range(12)]
    try:
        for sid in sessions:     # each HELLO renames the connection while earlier turns run
            session = Session(sid).serialize()
            client.emit(HiveMessage(HiveMessageType.HELLO, {"session": session}))
            client.emit(Message("recognizer_loop:utterance", {"utterances": ["wait 0.5"]},
                                {"session": session}))
        assert wait_until(lambda: len(handled) == len(sessions)), sorted(handled)
        assert answers == {sid: "done waiting" for sid in sessions}
    finally:
        client.close()


def test_a_turn_queued_for_a_satellite_that_left_leaves_no_open_turn(hub, plugin):
    protocol = plugin
    client = connect(hub, "leaver")
    started = threading.Event()
    client.on_mycroft("speak", lambda _m: started.set())
    session = Session("leaving").serialize()
    client.emit(HiveMessage(HiveMessageType.HELLO, {"session": session}))
    # one session's turns run in order: the second waits behind the first
    for text in ("wait 1", "hello", "hello"):
        client.emit(Message("recognizer_loop:utterance", {"utterances": [text]},
                            {"session": session}))
    assert wait_until(lambda: len(protocol.open_turns) == 3, 5)
    client.close()            # gone while one turn runs and two wait
    assert wait_until(lambda: not protocol.clients, 5)
    assert wait_until(lambda: len(protocol.open_turns) == 0, 10), len(protocol.open_turns)
