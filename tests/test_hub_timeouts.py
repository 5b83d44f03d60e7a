"""The hub plugin's rolling turn timeout, on a fake clock: a turn ends `timeout` seconds after
its last sentence (or its start), with "timeout" said to the satellite, and no sooner. The
satellite is a connection object shaped as hivemind-core 5.x's, recording what it is sent; no
hub, no socket, no sleeping for the timeout."""
import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from fake_clock import FakeClock
from ovos_bus_client.message import Message
from ovos_plugin_manager.templates.agents import AgentMessage, ChatEngine, MessageRole

from hivemind_chat_agent import ChatAgentProtocol


class HeldEngine(ChatEngine):
    """Says "first" when `go` is set, then nothing until `done` is; `started` once it runs."""

    def __init__(self):
        super().__init__({})
        self.started, self.go, self.done = threading.Event(), threading.Event(), threading.Event()

    def continue_chat(self, messages, session_id="default", lang=None, units=None, tools=None):
        return AgentMessage(MessageRole.ASSISTANT, "unused")

    def stream_sentences(self, messages, session_id="default", lang=None, units=None):
        self.started.set()
        self.go.wait(10)
        yield "first"
        self.done.wait(10)


class Satellite:
    """What the plugin needs of a 5.x connection: a Noise transport, a name, a key, `send`."""

    def __init__(self):
        self.noise_transport, self.peer, self.key = object(), "sat::1::x::s", "key-1"
        self.sent = []

    def send(self, hive_message):
        self.sent.append(hive_message.payload.msg_type)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))     # where the hub secret goes
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    clock, engine, satellite = FakeClock(), HeldEngine(), Satellite()
    protocol = ChatAgentProtocol(config={"timeout": 10}, engine=engine, clock=clock,
                                 hm_protocol=SimpleNamespace(clients={satellite.peer: satellite}))
    yield SimpleNamespace(protocol=protocol, clock=clock, engine=engine, satellite=satellite,
                          flush=lambda: loop.run_until_complete(asyncio.sleep(0.02)))
    engine.go.set()
    engine.done.set()
    protocol.shutdown()
    asyncio.set_event_loop(None)
    loop.close()


def ask(hub, text="hello"):
    """Send an utterance and return once the engine runs: the hub's timeout counts from
    there (a turn waiting for a worker is not timed)."""
    hub.protocol.bus.emit(Message("recognizer_loop:utterance", {"utterances": [text]},
                                  {"source": hub.satellite.peer,
                                   "session": {"session_id": "kitchen"}}))
    assert hub.engine.started.wait(5)


def wait_for(hub, condition):
    deadline = time.monotonic() + 5
    while not condition() and time.monotonic() < deadline:
        hub.flush()
    return condition()


def test_a_silent_engine_times_out_at_the_timeout_and_not_before(hub):
    ask(hub)
    hub.clock.advance(9.9)
    hub.flush()
    assert hub.satellite.sent == []
    hub.clock.advance(0.1)
    assert wait_for(hub, lambda: "ovos.utterance.handled" in hub.satellite.sent)
    assert hub.satellite.sent == ["complete_intent_failure", "ovos.utterance.handled"]
    assert len(hub.protocol.open_turns) == 0
    assert hub.clock.pending == 1          # the session sweep: no timer of the turn is left


def test_every_sentence_rolls_the_timeout_forward(hub):
    ask(hub)
    hub.clock.advance(6)
    hub.engine.go.set()                       # "first" at 6 s: the end moves to 16 s
    assert wait_for(hub, lambda: hub.satellite.sent == ["speak"])
    hub.clock.advance(9.9)
    hub.flush()
    assert hub.satellite.sent == ["speak"]
    hub.clock.advance(0.1)
    assert wait_for(hub, lambda: "ovos.utterance.handled" in hub.satellite.sent)
    assert hub.satellite.sent == ["speak", "complete_intent_failure", "ovos.utterance.handled"]


def test_a_query_whose_engine_is_silent_ends_at_the_timeout(hub):
    """hivemind-core's QUERY: the stream ends (None) after `timeout` seconds of silence."""
    answer = hub.protocol.natural_language_query("hello", "en-US")
    assert list(answer) == [None]
    assert hub.clock.now() == 10
