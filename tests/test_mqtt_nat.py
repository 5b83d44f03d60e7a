"""The hub-behind-NAT deployment of docs/scale-out.md, for real: Debian's mosquitto with
config/mosquitto.acl (each satellite's broker username is its access key; the hub's account
may use every HiveMind topic), a genuine 5.3.10a1 hub dialling out with its broker account,
our client with its own. Each satellite is answered; one that knows its own broker password
cannot write into another's session, read another's answers or fake another's presence."""
import json
import os
import secrets
import threading

import pytest

pytest.importorskip("paho.mqtt", reason="needs the [mqtt] extra (.ci/run installs it with "
                                        "[test]): pip install -c constraints.txt -e '.[mqtt]'")

from hubs import hub_generations  # noqa: E402
from mqtt_hub import MqttHub  # noqa: E402
from servers import MosquittoServer  # noqa: E402
from waiting import hold_still, wait_until  # noqa: E402

pytestmark = pytest.mark.hub
if "5" not in hub_generations():
    pytest.skip("hivemind-mqtt-protocol needs a 5.x hub", allow_module_level=True)
CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")
PREFIX = "hivemind"      # config/mosquitto.acl's, hivemind-mqtt-protocol's default


class Spy:
    """A paho client with a broker account, recording what reaches its subscriptions."""

    def __init__(self, port, username, password, topics):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        self.got, self.granted = [], []
        self.subscribed = threading.Event()
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                                  client_id=f"spy-{secrets.token_hex(4)}")
        self.client.username_pw_set(username, password)
        self.client.on_message = lambda c, u, m: self.got.append((m.topic, m.payload))
        self.client.on_subscribe = self._on_subscribe
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe([(t, 1) for t in topics])
        assert self.subscribed.wait(10)

    def _on_subscribe(self, client, userdata, mid, reasons, properties=None):
        self.granted = [getattr(r, "is_failure", False) for r in reasons]
        self.subscribed.set()

    def publish(self, topic, payload):
        info = self.client.publish(topic, payload, qos=1)
        info.wait_for_publish(10)     # the broker has taken (or silently dropped) it

    def close(self):
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def nat(tmp_path):
    """(hub, broker, {name: (key, broker password)}, the hub's broker password), the ACL of
    config/ enforced."""
    accounts = {name: (secrets.token_hex(16), secrets.token_urlsafe(12))
                for name in ("kitchen", "garage")}
    hub_password = secrets.token_urlsafe(12)
    broker = MosquittoServer(str(tmp_path / "broker"), acl=os.path.join(CONFIG, "mosquitto.acl"),
                             users={"hub": hub_password, **dict(accounts.values())}).start()
    hub = MqttHub(broker, mqtt={"topic_prefix": PREFIX, "broker_username": "hub",
                                "broker_password": hub_password}).start()
    try:
        yield hub, broker, accounts, hub_password
    finally:
        hub.cleanup()
        broker.stop()


def agent_for(hub, broker, key, broker_password, keys, make_agent):
    creds = hub.hub.add_client(key=key)
    return make_agent({"host": f"mqtt://127.0.0.1:{broker.port}", "key": key,
                       "password": creds.password, "topic_prefix": PREFIX, "timeout": 10,
                       "broker_username": key, "broker_password": broker_password,
                       "noise_key_dir": os.path.join(keys, key)})


def test_each_satellite_is_answered_through_the_acl_and_cannot_touch_anothers_topics(
        nat, tmp_path, make_agent):
    hub, broker, accounts, hub_password = nat
    (kitchen_key, kitchen_pw), (garage_key, garage_pw) = accounts["kitchen"], accounts["garage"]
    kitchen = agent_for(hub, broker, kitchen_key, kitchen_pw, str(tmp_path), make_agent)
    garage = agent_for(hub, broker, garage_key, garage_pw, str(tmp_path), make_agent)
    kitchen.get_response("remember the blue door", session_id="k")
    # what reaches the garage's topics, as the hub's account sees it (it may read them all)
    watcher = Spy(broker.port, "hub", hub_password, [f"{PREFIX}/{garage_key}/in"])
    # the kitchen's satellite, with its own broker account, tries the garage's topics
    intruder = Spy(broker.port, kitchen_key, kitchen_pw,
                   [f"{PREFIX}/{garage_key}/out", f"{PREFIX}/{garage_key}/status"])
    try:
        intruder.publish(f"{PREFIX}/{garage_key}/in", b"INTRUDER")
        intruder.publish(f"{PREFIX}/{garage_key}/status", b"offline")
        garage.get_response("remember the red gate", session_id="g")
        assert "red gate" in garage.get_response("recall", session_id="g")
        assert wait_until(lambda: watcher.got, 10)            # the garage's own frames
        hold_still()
        assert all(payload != b"INTRUDER" for _, payload in watcher.got)
        assert intruder.got == [], intruder.got               # none of its answers, nor status
        recalled = kitchen.get_response("recall", session_id="k")
        assert "blue door" in recalled and "red gate" not in recalled
    finally:
        watcher.close()
        intruder.close()


def test_the_examples_name_the_topics_the_hub_and_a_satellite_need():
    with open(os.path.join(CONFIG, "mosquitto.acl")) as f:
        acl = f.read()
    for line in ("user hub", "topic readwrite hivemind/#", "pattern write hivemind/%u/in",
                 "pattern read hivemind/%u/out", "pattern readwrite hivemind/%u/status"):
        assert line in acl
    with open(os.path.join(CONFIG, "mosquitto.conf")) as f:
        conf = f.read()
    assert "allow_anonymous false" in conf and "acl_file" in conf
    with open(os.path.join(CONFIG, "server-mqtt.json")) as f:
        mqtt = json.load(f)["network_protocol"]["hivemind-mqtt-plugin"]
    assert mqtt["broker_username"] == "hub" and mqtt["topic_prefix"] == PREFIX and mqtt["tls"]
