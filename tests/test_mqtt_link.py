"""The MQTT transport's sans-I/O parts: MqttGreeting (our HELLO, the hub's silence, its
session ending under us), the mqtt:// config, a reset's turns on HubLink and CarriedTurns, and
the one-connection-per-key rule. No broker, no socket, no sleep (clock readings passed in)."""
import pytest
from fake_clock import FakeClock
from test_hub_link import SESSION, handshake

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.core.hub_link import HubLink, LinkState
from hivemind_chat_agent.core.mqtt_link import HELLO_EVERY, QUIET, MqttGreeting, Phase, Topics
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import (
    AccessKeyInUseError,
    ConfigurationError,
    HubSessionDroppedError,
    HubSilentError,
    HubUnreachableError,
)

HUB_HELLO = b'{"msg_type": "hello", "payload": {"peer": "x", "node_id": "n"}}'
HUB_OFFER = b'{"msg_type": "handshake", "payload": {"noise": {}}}'
NOISE_FRAME = b"\x00\x17{ciphertext"


def greeting(deadline=10.0):
    g = MqttGreeting("mqtt://broker:1883", started=100.0, deadline=deadline)
    step = g.subscribed(100.0)
    assert step.open and step.hello and g.phase is Phase.GREETING
    return g


def test_the_topics_are_the_keys_under_the_hubs_prefix():
    t = Topics("home/hive", "KEY")
    assert (t.inbound, t.outbound, t.status) == ("home/hive/KEY/in", "home/hive/KEY/out",
                                                 "home/hive/KEY/status")


def test_we_say_hello_first_and_again_until_the_hub_answers():
    g = greeting()
    assert not g.tick(100.0 + HELLO_EVERY / 2).hello
    assert g.tick(100.0 + HELLO_EVERY).hello
    assert not g.tick(100.0 + HELLO_EVERY * 1.5).hello
    step = g.frame(HUB_HELLO, channel=False)
    assert step.deliver == HUB_HELLO.decode() and g.phase is Phase.ANSWERED
    assert not g.tick(200.0).hello and g.tick(200.0).fail is None   # answered: no deadline
    assert g.frame(HUB_OFFER, channel=False).deliver == HUB_OFFER.decode()
    assert g.hellos == 2


def test_silence_until_the_deadline_is_a_typed_error_that_says_what_to_check():
    g = greeting(deadline=5.0)
    assert g.tick(104.9).fail is None
    error = g.tick(105.0).fail
    assert isinstance(error, HubSilentError) and isinstance(error, HubUnreachableError)
    for what in ("registered", "topic_prefix", "connected to this broker", "5 s"):
        assert what in str(error)
    assert g.phase is Phase.ENDED and g.tick(200.0) == g.tick(300.0)


def test_a_live_offline_while_greeting_asks_for_the_next_hello_once_the_topic_is_quiet():
    """A hub holding a stale session of this key (a broker restart) drops it on our plain
    HELLO and says "offline", then reads that back and drops whatever session the key has:
    the next HELLO waits for QUIET s without an "offline"."""
    g = greeting()
    assert not g.status(b"offline", retained=False, channel=False, now=100.1).hello
    assert not g.status(b"offline", retained=True, channel=False, now=100.2).hello
    assert not g.status(b"online", retained=False, channel=False, now=100.3).hello
    assert not g.status(b"offline", retained=False, channel=False, now=100.3).hello
    assert not g.tick(100.3 + QUIET / 2).hello
    assert g.tick(100.3 + QUIET).hello


def test_a_connection_soon_after_an_offline_waits_for_quiet_before_its_hello():
    g = MqttGreeting("b", started=10.0, deadline=10.0)
    step = g.subscribed(10.0, not_before=10.2)
    assert step.open and not step.hello
    assert not g.tick(10.1).hello and g.tick(10.2).hello


def test_after_the_handshake_frames_pass_as_bytes_and_a_plain_hello_is_a_reset():
    g = greeting()
    g.frame(HUB_HELLO, channel=False)
    assert g.frame(NOISE_FRAME, channel=True).deliver == NOISE_FRAME
    assert g.frame(b"{not json", channel=True).deliver == b"{not json"   # the channel decides
    step = g.frame(HUB_HELLO, channel=True)
    assert "new session" in step.reset and g.phase is Phase.ENDED
    assert g.frame(NOISE_FRAME, channel=True).deliver is None


def test_a_second_hello_of_the_hubs_during_the_handshake_is_a_reset():
    """Our handshake went to a session the hub dropped; the next frame opened another."""
    g = greeting()
    g.frame(HUB_HELLO, channel=False)
    g.frame(HUB_OFFER, channel=False)
    assert "during the handshake" in g.frame(HUB_HELLO, channel=False).reset


@pytest.mark.parametrize("channel,said", [(True, "session"), (False, "during the handshake")])
def test_a_live_offline_once_answered_is_a_reset(channel, said):
    g = greeting()
    g.frame(HUB_HELLO, channel=False)
    assert g.status(b"offline", retained=True, channel=channel, now=101.0).reset == ""
    assert said in g.status(b"offline", retained=False, channel=channel, now=101.0).reset


def test_nothing_before_the_subscriptions():
    g = MqttGreeting("b", 0.0, 10.0)
    assert g.frame(HUB_HELLO, channel=False).deliver is None
    assert g.tick(50.0).fail is None


# ---- config ----

def cfg(**kw):
    return ClientConfig.from_dict({"key": "K", "password": "P", **kw})


def test_an_mqtt_host_names_a_broker_with_its_default_ports_and_the_hubs_prefix():
    c = cfg(host="mqtt://broker.lan")
    assert (c.transport, c.host, c.port, c.secure, c.topic_prefix) == \
        ("mqtt", "broker.lan", 1883, False, "hivemind")
    assert c.url_host == "mqtt://broker.lan"
    s = cfg(host="mqtts://broker.lan", topic_prefix="home/hive/", broker_username="u",
            broker_password="pw")
    assert (s.port, s.secure, s.topic_prefix, s.broker_username, s.broker_password) == \
        (8883, True, "home/hive", "u", "pw")
    assert "pw" not in repr(s)
    assert cfg(host="mqtt://b:1999").port == 1999 and cfg(host="mqtt://b", port=7).port == 7
    assert cfg(host="ws://hub").transport == "websocket"
    # one session per key: every conversation shares the one connection
    one = cfg(host="mqtt://b", shared_connections=4, share_connections=False)
    assert (one.shared_connections, one.share_connections, one.spare_connections) == \
        (1, True, 0)


@pytest.mark.parametrize("extra,what", [
    ({"host": ["mqtt://a", "ws://b"]}, "cannot mix"),
    ({"host": "mqtts://a", "self_signed": True}, "self_signed"),
    ({"host": "mqtt://a", "topic_prefix": "hive/#"}, "wildcards"),
    ({"host": "mqtt://a", "broker_password": "x"}, "broker_username"),
])
def test_a_contradictory_mqtt_config_is_refused(extra, what):
    with pytest.raises(ConfigurationError, match=what):
        cfg(**extra)


# ---- a reset's turns ----

def test_a_reset_of_a_ready_link_loses_its_turns_as_unsent(tmp_path):
    from handshake_vectors import inputs
    link = HubLink(inputs(tmp_path), "hall", SESSION)
    handshake(tmp_path, link)
    decision = link.session_reset("the hub started a new session")
    assert decision.unsent and decision.close and link.state is LinkState.CLOSED
    assert decision.lose_turns == ("the hub started a new session", EndReason.NONE)
    assert link.session_reset("again").lose_turns is None


def test_a_reset_during_the_handshake_is_a_failed_connect(tmp_path):
    from handshake_vectors import inputs
    link = HubLink(inputs(tmp_path), "hall", SESSION)
    link.opened()
    decision = link.session_reset("the hub closed this access key's session")
    assert isinstance(decision.failed, HubSessionDroppedError) and decision.close
    assert isinstance(decision.failed, HubUnreachableError)


def test_only_the_turns_that_got_nothing_back_are_unsent():
    from hivemind_chat_agent.client.carried_turns import CarriedTurns
    from hivemind_chat_agent.client.session_book import SessionBook
    from hivemind_chat_agent.core.turns import Progress

    class Sink:
        def __init__(self):
            self.events = []

        def add_sentence(self, text):
            self.events.append(text)

        def hub_stopped(self, *a):
            pass

    clock = FakeClock()
    turns = CarriedTurns(SessionBook("chat-test"), clock, 100)
    quiet = turns.open("a", "t1", 30, Sink(), lambda: None)
    spoken = turns.open("b", "t2", 30, Sink(), lambda: None)
    spoken.turn.state = Progress.SPEAKING
    turns.lose_all("reset", EndReason.NONE, unsent=True)
    assert quiet.wait_end(clock, 0).kind is EndReason.UNSENT
    assert spoken.wait_end(clock, 0).kind is EndReason.NONE


# ---- one connection per key ----

def test_a_second_connection_on_one_key_through_one_broker_is_refused(monkeypatch):
    pytest.importorskip("paho.mqtt", reason="needs the [mqtt] extra (in [test])")
    from hivemind_chat_agent.client import mqtt_transport
    monkeypatch.setattr(mqtt_transport, "KEY_FREED_WITHIN", 0.05)
    key = ("broker", 1883, "hivemind", "K")
    mqtt_transport._claim(key, 1, "mqtt://broker:1883")
    try:
        mqtt_transport._claim(key, 1, "mqtt://broker:1883")       # the same holder: fine
        with pytest.raises(AccessKeyInUseError, match="one session per key"):
            mqtt_transport._claim(key, 2, "mqtt://broker:1883")
        mqtt_transport._claim(("broker", 1883, "other", "K"), 2, "b")   # another prefix
    finally:
        mqtt_transport._free(key, 1)
        mqtt_transport._free(("broker", 1883, "other", "K"), 2)
    mqtt_transport._claim(key, 2, "b")
    mqtt_transport._free(key, 2)


# ---- the turn the hub never read, sent again by its driver ----

class TwoConnections:
    """A pool for one turn's driver: `first`, then (after a discard) `second`."""

    def __init__(self, first, second, clock):
        from hivemind_chat_agent.client.churn_gate import ChurnGate
        self.conns, self.leases, self.discarded = [first, second], 0, []
        self.gate = ChurnGate(0, stagger=0, clock=clock)

    def acquire(self, session, abandonment=None):
        self.leases += 1
        return self.conns[min(len(self.discarded), 1)]

    def release(self, conn):
        self.leases -= 1

    def discard(self, session_id):
        self.discarded.append(session_id)

    def broke(self, session_id, conn):
        pass


def drive_through_a_reset(tmp_path, speak_first):
    """A turn on a hub that keeps no turn records (a stock one); the hub's session ends under
    it (`on_session_reset`, as MqttTransport reports it), after a sentence or before any."""
    import threading
    from types import SimpleNamespace

    from ovos_bus_client.message import Message
    from ovos_bus_client.session import Session
    from test_connection_routing import ready_connection, say
    from test_turns import Host

    from hivemind_chat_agent.client.chat_turn import ChatTurn
    from hivemind_chat_agent.client.turn_driver import TurnDriver
    from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
    clock = FakeClock()
    first = ready_connection(tmp_path / "1", clock=clock)
    second = ready_connection(tmp_path / "2", clock=clock)
    pool = TwoConnections(first, second, clock)
    host = Host(pool, first.config)
    assert not host.hub_keeps_turns
    session_lock = SimpleNamespace(lock=threading.Lock())
    session_lock.lock.acquire()
    driver = TurnDriver(host, "mine", session_lock)
    turn = driver.turn = ChatTurn("mine", "hello", "en-US")
    driver.send(Session("mine"), "hello")
    tag = driver.handle.turn.tag
    if speak_first:
        say(first, "half an answer", tag)
    first.on_session_reset("the hub started a new session for this access key")

    def answer_on_second():
        from hivemind_bus_client.message import HiveMessage, HiveMessageType
        say(second, "the whole answer", tag)
        second.on_socket_message(HiveMessage(HiveMessageType.BUS, payload=Message(
            "ovos.utterance.handled", {}, {"session": {"session_id": "mine"},
                                           TURN_TAG_KEY: tag})))
    clock.call_later(1, answer_on_second)
    driver.adopt()
    driver.run()
    return turn, pool, first, second


def test_a_turn_the_hub_never_read_is_sent_again_on_a_new_session_even_on_a_stock_hub(
        tmp_path):
    from hivemind_chat_agent.core.outcomes import TurnStatus
    turn, pool, first, second = drive_through_a_reset(tmp_path, speak_first=False)
    assert turn.status is TurnStatus.ANSWERED, turn.get_exception()
    assert turn.sentences == ["the whole answer"] and pool.discarded == ["mine"]
    assert not first.alive and pool.leases == 0


def test_a_turn_that_had_begun_to_answer_is_not_sent_again(tmp_path):
    from hivemind_chat_agent.core.outcomes import TurnStatus
    from hivemind_chat_agent.errors import ConnectionLostError
    turn, pool, _first, _second = drive_through_a_reset(tmp_path, speak_first=True)
    assert turn.status is TurnStatus.LOST
    assert isinstance(turn.get_exception(), ConnectionLostError)
    assert turn.sentences == ["half an answer"]
