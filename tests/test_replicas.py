"""Replicas: two genuine hivemind-core 5.x hubs from config/server-replica.json sharing one real
redis-server, behind a real haproxy from config/haproxy.cfg, with the hub identity cloned as
docs/scale-out.md says. The replica holding a conversation's connection is killed (-9) between
turns; the conversation continues on the other, for our client and for a stock
hivemind-bus-client satellite."""
import json
import os
import shutil
import threading
import time
from types import SimpleNamespace

import pytest
from hivemind_bus_client.client import HiveMessageBusClient
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session

from hubs import HubProcess
from hivemind_chat_agent import HiveMindChatAgent
from servers import HAProxy, RedisServer
from test_hub_protocol import satellite_identity

pytestmark = pytest.mark.hub

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")


def replica(store_url: str) -> HubProcess:
    with open(os.path.join(CONFIG, "server-replica.json")) as f:
        config = json.load(f)
    config["agent_protocol"]["hivemind-chat-agent-plugin"]["conversation_store"] = store_url
    return HubProcess(server_config=config, generation="5")


def clone_identity(source: HubProcess, target: HubProcess) -> None:
    """Copy the hub identity (`$XDG_CONFIG_HOME/hivemind/`: RSA key, Noise key, _identity.json)
    as an operator copies it to another machine; paths inside point at the new home."""
    src = os.path.join(source.home, "config", "hivemind")
    dst = os.path.join(target.home, "config", "hivemind")
    shutil.copytree(src, dst, dirs_exist_ok=True)
    path = os.path.join(dst, "_identity.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace(source.home, target.home))


@pytest.fixture
def deployment(tmp_path):
    """Redis, replica A started, replica B configured but not started, haproxy in front of
    both. `second()` clones A's identity into B (after A's first handshake made its Noise key),
    starts B, registers the same client there and waits until haproxy counts it up."""
    redis = RedisServer(str(tmp_path / "redis")).start()
    a, b = replica(redis.url), replica(redis.url)
    proxy = HAProxy(str(tmp_path / "haproxy"), os.path.join(CONFIG, "haproxy.cfg"),
                    [a.port, b.port]).start()
    a.start()
    creds = a.add_client(name="replicated")
    assert proxy.wait_until(lambda s: s["hub1"]["status"] == "UP"), proxy.servers()

    def second():
        clone_identity(a, b)
        b.start()
        b.add_client(name="replicated", key=creds.key, password=creds.password)
        assert proxy.wait_until(lambda s: s["hub2"]["status"] == "UP"), proxy.servers()

    def holder():
        """The replica a connection is on, by haproxy's count of its sessions."""
        servers = proxy.servers()
        return a if servers["hub1"]["sessions"] else b if servers["hub2"]["sessions"] else None
    yield SimpleNamespace(redis=redis, a=a, b=b, proxy=proxy, key=creds.key,
                          password=creds.password, second=second, holder=holder)
    proxy.stop()
    a.cleanup()
    b.cleanup()
    redis.stop()


def test_a_conversation_continues_on_the_other_replica_after_kill_9(deployment):
    agent = HiveMindChatAgent({"host": "127.0.0.1", "port": deployment.proxy.port,
                               "key": deployment.key, "password": deployment.password,
                               "timeout": 20})
    try:
        assert "Ada" in agent.get_response("my name is Ada", session_id="kitchen")
        deployment.second()
        held = deployment.holder()
        assert held is deployment.a
        held.kill()
        assert deployment.proxy.wait_until(lambda s: s["hub1"]["sessions"] == 0)
        started = time.monotonic()
        assert agent.get_response("what is my name", session_id="kitchen") == \
            "Your name is Ada."
        elapsed = time.monotonic() - started
        assert deployment.holder() is deployment.b
        print(f"first turn after kill -9 of the replica: {elapsed:.2f} s")
        assert elapsed < 5, elapsed
    finally:
        agent.shutdown()


class Satellite:
    """A stock hivemind-bus-client satellite through haproxy; it reconnects by itself."""

    def __init__(self, deployment):
        self.client = HiveMessageBusClient(
            key=deployment.key, password=deployment.password, host="ws://127.0.0.1",
            port=deployment.proxy.port, useragent="replica-satellite",
            identity=satellite_identity())
        self.answers, self.handled = [], threading.Event()
        self.client.connect()
        self.client.on_mycroft("speak", lambda m: self.answers.append(m.data["utterance"]))
        self.client.on_mycroft("ovos.utterance.handled", lambda m: self.handled.set())

    def ready(self) -> bool:
        """Its channel is up (the library clears it on close and sets it after a handshake);
        what it emits before that goes out unencrypted and the hub drops it."""
        return getattr(self.client, "noise_transport", None) is not None

    def wait(self, condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        return condition()

    def ask(self, text, wait=10.0):
        self.answers.clear()
        self.handled.clear()
        self.client.emit(Message("recognizer_loop:utterance", {"utterances": [text]},
                                 {"session": Session("sat-kitchen").serialize()}))
        assert self.handled.wait(wait), f"no answer to {text!r} within {wait} s"
        return "\n".join(self.answers)


def test_a_stock_satellite_reconnects_through_haproxy_and_continues(deployment):
    satellite = Satellite(deployment)
    try:
        assert "Bo" in satellite.ask("my name is Bo")
        deployment.second()
        assert deployment.holder() is deployment.a
        deployment.a.kill()
        assert satellite.wait(lambda: not satellite.ready(), 10)     # it saw the close
        assert satellite.wait(satellite.ready, 30)       # and reconnected (2.5-7.5 s later)
        assert satellite.ask("what is my name") == "Your name is Bo."
        assert deployment.holder() is deployment.b
    finally:
        satellite.client.close()
