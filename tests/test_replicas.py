"""Replicas: two genuine hivemind-core 5.x hubs from config/server-replica-shared-db.json
sharing one real redis-server (conversations and clients), behind a real haproxy from
config/haproxy.cfg, with the hub identity cloned as docs/scale-out.md says. The replica holding
a conversation's connection is killed (-9) between turns; the conversation continues on the
other, for our client and for a stock hivemind-bus-client satellite."""
import json
import threading
import time

import pytest
from hivemind_bus_client.client import HiveMessageBusClient
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from raw_satellite import satellite_identity
from replicas import ReplicaSet
from test_hub_metrics import scrape, turns
from waiting import hold_still, wait_until

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.bridges.front_metrics import FrontMetrics
from hivemind_chat_agent.errors import HiveMindChatError

pytestmark = pytest.mark.hub


@pytest.fixture
def deployment(tmp_path):
    replicas = ReplicaSet(str(tmp_path)).start()
    yield replicas
    replicas.stop()


def test_a_conversation_continues_on_the_other_replica_after_kill_9(deployment):
    agent = HiveMindChatAgent(deployment.agent_config(timeout=20))
    try:
        assert "Ada" in agent.get_response("my name is Ada", session_id="kitchen")
        first, second = deployment.hubs[0], deployment.add_replica()
        assert deployment.holder() is first
        first.kill()
        assert deployment.wait_no_sessions(first)
        started = time.monotonic()
        assert agent.get_response("what is my name", session_id="kitchen") == \
            "Your name is Ada."
        elapsed = time.monotonic() - started
        assert deployment.holder() is second
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
        """Its handshake is over: the library clears `handshake_event` on close and sets it
        once its HELLO is sent. Not `noise_transport`, which it sets before that HELLO: an
        utterance emitted from this thread then races the library's own thread for the
        channel's next nonce and for the hub's reading of the HELLO."""
        return self.client.handshake_event.is_set() and \
            getattr(self.client, "noise_transport", None) is not None

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
        first, second = deployment.hubs[0], deployment.add_replica()
        assert deployment.holder() is first
        first.kill()
        assert wait_until(lambda: not satellite.ready(), 10)     # it saw the close
        assert wait_until(satellite.ready, 30)       # and reconnected (2.5-7.5 s later)
        assert satellite.ask("what is my name") == "Your name is Bo."
        assert deployment.holder() is second
    finally:
        satellite.client.close()


def slow_turn_killed_after_its_first_sentence(deployment):
    """Ask for three sentences a second apart through haproxy, kill -9 the replica answering
    after the first arrives; what the caller got, and the turn."""
    agent = HiveMindChatAgent(deployment.agent_config(timeout=20))
    try:
        assert agent.get_response("hello", session_id="kitchen")   # the hub's records said
        deployment.add_replica()
        deployment.before_turn = deployment.proxy.servers()
        holder = deployment.holder()
        started = time.monotonic()
        turn = agent.begin([{"role": "user", "content": "slow 3 1"}], session_id="kitchen")
        heard = []
        try:
            for sentence in turn:
                heard.append(sentence)
                if len(heard) == 1:
                    holder.kill()
        except HiveMindChatError:    # a lost turn raises at its end; its status says so
            pass
        print(f"the killed turn ended {turn.status.value} {time.monotonic() - started:.1f} s "
              "after it was asked")
        return heard, turn, agent.hub_keeps_turns
    finally:
        agent.shutdown()


@pytest.fixture
def script_replicas(tmp_path):
    replicas = ReplicaSet(str(tmp_path), engine="engines:ScriptEngine").start()
    yield replicas
    replicas.stop()


def test_a_turn_in_flight_survives_its_replicas_death_and_no_sentence_comes_twice(
        script_replicas):
    """The client resends the lost turn by its id; the other replica waits for the dead
    one's 'alive' key to lapse, takes the turn over and runs it; the caller gets each
    sentence once."""
    heard, turn, keeps = slow_turn_killed_after_its_first_sentence(script_replicas)
    assert keeps
    assert heard == ["slow sentence 1", "slow sentence 2", "slow sentence 3"]
    assert turn.status.value == "answered"


def test_a_turn_whose_connection_haproxy_cut_is_answered_once_and_kept_once(script_replicas):
    """The replica stays alive; haproxy cuts the connection after the first sentence (as a
    reload or `shutdown sessions` does). The client resends the turn by its id, the turn is
    answered from the replica that ran it, each sentence once, its engine ran once, and its
    exchange is in the conversation's history once (before, the replica dropped it: the cut
    satellite's session was no longer followed there). The replicas' and the client's metrics
    count it as it happened."""
    deployment = script_replicas
    agent = HiveMindChatAgent(deployment.agent_config(timeout=20))
    seen = FrontMetrics("openai")        # what a front's metrics count of this client
    agent.observe(seen)
    try:
        assert agent.get_response("hello", session_id="kitchen")
        deployment.add_replica()
        holder = deployment.holder()
        turn = agent.begin([{"role": "user", "content": "slow 3 1"}], session_id="kitchen")
        heard = []
        for sentence in turn:
            heard.append(sentence)
            if len(heard) == 1:
                deployment.proxy.command(
                    f"shutdown sessions server hubs/{deployment.name(holder)}")
        assert heard == ["slow sentence 1", "slow sentence 2", "slow sentence 3"]
        assert turn.status.value == "answered"
        # the metrics say so too: the engine's run counted answered where it ran, the resend
        # replayed where it landed (either replica), the client's resend and reconnect once
        def total():      # a turn is counted just after its end is queued: waited for
            counted = [turns(scrape(h.health_port)) for h in deployment.running]
            return {k: sum(c[k] for c in counted) for k in counted[0]}
        expected = {"answered": 2, "replayed": 1, "asked": 0, "not_understood": 0,
                    "failed": 0, "timed_out": 0, "stopped": 0}
        assert wait_until(lambda: total() == expected, 20), total()
        client = seen.registry.get_sample_value
        assert client("hivemind_chat_client_resends_total",
                      {"front": "openai", "reason": "lost"}) == 1
        assert client("hivemind_chat_client_reconnects_total", {"front": "openai"}) == 1
        history = json.loads(agent.get_response("history", session_id="kitchen"))
        answer = "slow sentence 1\nslow sentence 2\nslow sentence 3"
        assert history.count(["user", "slow 3 1"]) == 1, history
        assert history.count(["assistant", answer]) == 1, history
    finally:
        agent.shutdown()
    ran = 0
    for hub in deployment.running:         # each replica's engine, asked directly
        direct = HiveMindChatAgent({"host": "127.0.0.1", "port": hub.port, "key": deployment.key,
                                    "password": deployment.password, "timeout": 20})
        try:
            ran += json.loads(direct.get_response("asked", session_id="probe")).count("slow 3 1")
        finally:
            direct.shutdown()
    assert ran == 1


@pytest.fixture
def pipeline_replicas(tmp_path):
    """Hubs answering as OVOS does (tests/pipeline_agent.py), which keep no turn records."""
    from hubs import HubProcess
    replicas = ReplicaSet(str(tmp_path), hub=lambda _url, _clients: HubProcess(generation="5"))
    replicas.start()
    yield replicas
    replicas.stop()


def test_a_turn_lost_on_a_hub_without_turn_records_is_never_sent_again(pipeline_replicas):
    """An OVOS hub's skill may have acted already ("turn on the heater"): the loss is
    reported, and no connection to the other replica is even opened for it."""
    from hivemind_chat_agent.errors import ConnectionLostError
    heard, turn, keeps = slow_turn_killed_after_its_first_sentence(pipeline_replicas)
    assert not keeps and heard == ["slow sentence 1"]
    assert turn.status.value == "lost" and isinstance(turn.get_exception(), ConnectionLostError)
    hold_still(3)         # a resend would connect at once
    assert pipeline_replicas.proxy.servers()["hub2"]["total"] == \
        pipeline_replicas.before_turn["hub2"]["total"]


def test_a_host_list_of_hubs_with_keys_of_their_own_continues_the_conversation(tmp_path):
    """No haproxy: `host` lists two hubs sharing the Redis store and client database, each with
    its own identity.
    The client pins each hub's key under its own address, so the second is accepted when the
    first dies; the conversation continues there, and a turn in flight is sent again."""
    from replicas import replica
    from servers import RedisServer
    redis = RedisServer(str(tmp_path / "redis")).start()
    first, second = replica(redis.url, redis).start(), replica(redis.url, redis).start()
    try:
        creds = first.add_client(name="listed")      # once: the client database is shared
        agent = HiveMindChatAgent({"host": [f"ws://127.0.0.1:{first.port}",
                                            f"ws://127.0.0.1:{second.port}"],
                                   "key": creds.key, "password": creds.password,
                                   "timeout": 20})
        try:
            assert "Ada" in agent.get_response("my name is Ada", session_id="listed")
            first.kill()         # the process is gone; then the client saw its socket close
            assert wait_until(lambda: not getattr(agent.pool.peek("listed"), "alive", False))
            assert agent.get_response("what is my name", session_id="listed") == \
                "Your name is Ada."
        finally:
            agent.shutdown()
    finally:
        first.cleanup()
        second.cleanup()
        redis.stop()
