"""A hub plugin draining (issue 27, part 4) on an embedded 5.x hub (LocalHub), without haproxy:
the turn running when the drain begins is finished, a turn arriving meanwhile is refused with
the `draining` reason (our client sends it again, and here, with no other replica, ends with
HubDrainingError), a stock satellite hears why, idle connections are closed, and `/readyz`
says 503 "draining" from the first moment."""
import threading
import time

import pytest
from engines import ScriptEngine
from hivemind_bus_client.client import HiveMessageBusClient
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from raw_satellite import satellite_identity
from waiting import wait_until

from hivemind_chat_agent import ChatAgentProtocol, HiveMindChatAgent, HubDrainingError
from hivemind_chat_agent.bridges.local_hub import LocalHub
from hivemind_chat_agent.client.turn_driver import DRAINING_RESENDS
from hivemind_chat_agent.hub.draining import DRAINING_SPEECH

pytestmark = pytest.mark.hub


@pytest.fixture
def plugin():
    protocol = ChatAgentProtocol(config={"engine": "engines:ScriptEngine", "drain_timeout": 10},
                                 engine=ScriptEngine())
    yield protocol
    protocol.shutdown()


@pytest.fixture
def hub(plugin):
    local = LocalHub(plugin).start()
    yield local
    local.stop()


def satellite(hub, name):
    creds = hub.add_client(name=name)
    client = HiveMessageBusClient(key=creds.key, password=creds.password, host="ws://127.0.0.1",
                                  port=hub.port, useragent=name, identity=satellite_identity())
    client.connect()
    return client


def draining(plugin):
    """The drain on a thread of its own, as hivemind-core's exit runs it; its report."""
    report = {}
    thread = threading.Thread(target=lambda: report.update(r=plugin.drain()), daemon=True)
    thread.start()
    assert wait_until(lambda: plugin.draining, 5)
    return thread, report


def test_the_running_turn_finishes_a_new_one_is_refused_and_idle_satellites_are_closed(
        hub, plugin):
    creds = hub.add_client(name="drained")
    running = HiveMindChatAgent(creds.agent_config(timeout=20))
    late = HiveMindChatAgent(creds.agent_config(timeout=20))
    idle = satellite(hub, "idle")
    try:
        assert late.get_response("hello", session_id="late") == "hello there"   # connected
        assert wait_until(lambda: len(plugin.clients) == 2, 10), list(plugin.clients)
        turn = running.begin([{"role": "user", "content": "slow 3 0.5"}], session_id="busy")
        assert wait_until(lambda: len(plugin.open_turns) == 1, 5)
        started = time.monotonic()
        thread, report = draining(plugin)
        assert plugin.readiness().status == 503 and plugin.readiness().reason == "draining"
        with pytest.raises(HubDrainingError):
            late.get_response("hello", session_id="late")
        assert list(turn) == ["slow sentence 1", "slow sentence 2", "slow sentence 3"]
        assert turn.status.value == "answered"
        thread.join(15)
        drained = report["r"]
        print(f"drained in {drained.seconds:.2f} s ({time.monotonic() - started:.2f} s): "
              f"{drained}")
        assert drained.finished == 1 and drained.cut == 0
        # the first send and each resend until the drain ended (the process exits then;
        # here the hub goes on refusing): all refused, none ran
        assert 2 <= drained.refused <= 1 + DRAINING_RESENDS
        assert drained.closed >= 3                           # idle, late (each time), busy
        assert drained.seconds < 10
        assert not plugin.serving
    finally:
        running.shutdown()
        late.shutdown()
        idle.close()


def test_a_stock_satellite_asking_during_the_drain_hears_why_and_is_closed(hub, plugin):
    """It connects after the drain began (its load balancer had not noticed yet): an idle
    satellite connected before is closed at once."""
    creds = hub.add_client(name="busy")
    running = HiveMindChatAgent(creds.agent_config(timeout=20))
    sat = None
    try:
        turn = running.begin([{"role": "user", "content": "slow 2 1"}], session_id="busy")
        assert wait_until(lambda: len(plugin.open_turns) == 1, 5)
        thread, report = draining(plugin)
        sat = satellite(hub, "stock")
        heard, failures, handled = [], [], threading.Event()
        sat.on_mycroft("speak", lambda m: heard.append(m.data["utterance"]))
        sat.on_mycroft("complete_intent_failure", lambda m: failures.append(m.data))
        sat.on_mycroft("ovos.utterance.handled", lambda m: handled.set())
        session = Session("kitchen").serialize()
        sat.emit(HiveMessage(HiveMessageType.HELLO, {"session": session}))
        sat.emit(Message("recognizer_loop:utterance", {"utterances": ["hello"]},
                         {"session": session}))
        assert handled.wait(10)
        assert heard == [DRAINING_SPEECH]
        assert [f["reason"] for f in failures] == ["draining"]
        assert list(turn) == ["slow sentence 1", "slow sentence 2"]
        thread.join(15)
        assert report["r"].refused == 1 and report["r"].finished == 1
    finally:
        running.shutdown()
        if sat is not None:
            sat.close()


def test_a_drain_with_nothing_running_ends_at_once(hub, plugin):
    sat = satellite(hub, "alone")
    try:
        assert wait_until(lambda: len(plugin.clients) == 1, 10)
        drained = plugin.drain()
        assert drained.closed == 1 and drained.finished == 0 and drained.seconds < 2
        assert not plugin.serving
    finally:
        sat.close()


def test_a_turn_still_running_at_drain_timeout_is_cut_and_the_drain_ends_on_time(hub, plugin):
    protocol = plugin
    protocol.drainer.plan.timeout = 1.0      # drain_timeout 1 s, against a 3 s answer
    creds = hub.add_client(name="slow")
    agent = HiveMindChatAgent(creds.agent_config(timeout=5))
    try:
        turn = agent.begin([{"role": "user", "content": "slow 3 1"}], session_id="long")
        assert wait_until(lambda: len(protocol.open_turns) == 1, 5)
        drained = protocol.drain()
        assert drained.cut == 1 and drained.finished == 0
        assert 1.0 <= drained.seconds < 2.0, drained
        assert turn.status.value != "answered"       # cut: its connection was closed
    finally:
        agent.shutdown()
