"""A hivemind-core 5.x hub that serves satellites through an MQTT broker as well as over its
websocket, our hub plugin answering both: tests/hub_venvs.py's mqtt-hub-5 (hivemind-core
5.3.10a1, hivemind-mqtt-protocol 0.2.5a2), for tests/test_mqtt_real.py and
benchmarks/bench_mqtt.py."""
import json
import os
from typing import Optional

from hubs import HubProcess, plugin_config
from servers import MosquittoServer
from waiting import wait_until

from hivemind_chat_agent.bridges.local_hub import hub_environment

PREFIX = "hm-test"   # the hub's topic_prefix


class MqttHub:
    """The mqtt-hub-5 hub: websocket and MQTT network protocols, our plugin answering both."""

    def __init__(self, broker: MosquittoServer, idle_timeout: float = 300,
                 agent_protocol: Optional[dict] = None, mqtt: Optional[dict] = None, **knobs):
        """`agent_protocol`: another plugin than ours (`knobs`: our plugin's settings);
        `mqtt`: more of hivemind-mqtt-protocol's settings (topic_prefix, broker_username...)."""
        self.broker = broker
        self.hub = HubProcess(agent_protocol or plugin_config(**knobs), generation="5",
                              venv="mqtt-hub-5")
        path = os.path.join(hub_environment(self.hub.home)["XDG_CONFIG_HOME"], "hivemind-core",
                            "server.json")
        with open(path) as f:
            config = json.load(f)
        config["network_protocol"]["hivemind-mqtt-plugin"] = {
            "broker_host": "127.0.0.1", "broker_port": broker.port, "topic_prefix": PREFIX,
            "idle_timeout": idle_timeout, **(mqtt or {})}
        with open(path, "w") as f:
            json.dump(config, f)

    def start(self, connected: int = 1) -> "MqttHub":
        """Start (or start again) the hub; return once it has subscribed to its MQTT topics
        for the `connected`-th time (its log is kept across restarts)."""
        self.hub.start()
        return self.connected(connected)

    def connected(self, times: int = 1) -> "MqttHub":
        """Wait until the hub's MQTT protocol has connected to the broker `times` times."""
        connected = times
        if not wait_until(lambda: self.hub.logs().count("[MQTT] Connected to broker")
                          >= connected, 30):
            raise RuntimeError("the hub's MQTT protocol did not connect to the broker:\n"
                               + self.hub.logs()[-3000:])
        return self

    def client(self, **extra) -> dict:
        creds = self.hub.add_client()
        return {"host": f"mqtt://127.0.0.1:{self.broker.port}", "key": creds.key,
                "password": creds.password, "topic_prefix": PREFIX, "timeout": 10,
                **extra}

    def cleanup(self) -> None:
        self.hub.cleanup()
