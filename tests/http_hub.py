"""A hivemind-core 5.x hub that serves satellites over HTTP as well as over its websocket, our
hub plugin answering both: tests/hub_venvs.py's http-hub-5 (hivemind-core 5.3.10a1,
hivemind-http-protocol 0.0.20a2, its listener on a free port of 127.0.0.1), for
tests/test_http_transport.py; and `HttpSatellite`, hivemind-bus-client's own
`HiveMindHTTPClient` (1.2.12a1, the test process's), as a satellite on that transport runs it
(`WsSatellite`: the same library's websocket client, recording the same way, to compare).

    hub = HttpHub().start(); sat = HttpSatellite(hub.http_port, hub.hub.add_client())
    sat.say("hello", session_id="a"); sat.until_handled(); sat.close(); hub.cleanup()
"""
import json
import os
import tempfile
import threading
import time
from typing import Optional

from hubs import HubProcess, free_port, plugin_config, wait_listening

from hivemind_chat_agent.bridges.local_hub import hub_environment

HANDLED = "ovos.utterance.handled"
SPEAK = "speak"


class HttpHub:
    """The http-hub-5 hub: websocket and HTTP network protocols, `agent_protocol` (our plugin
    in chat mode with tests/engines.py's ScriptEngine by default, `knobs` its settings)."""

    def __init__(self, agent_protocol: Optional[dict] = None, venv: str = "http-hub-5",
                 **knobs):
        self.hub = HubProcess(agent_protocol or plugin_config(**knobs), generation="5",
                              venv=venv)
        self.http_port = add_http_listener(self.hub)

    def start(self) -> "HttpHub":
        self.hub.start()   # returns once the websocket listens
        wait_http(self.hub, self.http_port)
        return self

    def cleanup(self) -> None:
        self.hub.cleanup()


def add_http_listener(hub: HubProcess) -> int:
    """hivemind-http-protocol on a free port of 127.0.0.1 in `hub`'s server.json (a hub of a
    venv that has it: http-hub-5); returns the port."""
    port = free_port()
    path = os.path.join(hub_environment(hub.home)["XDG_CONFIG_HOME"], "hivemind-core",
                        "server.json")
    with open(path) as f:
        config = json.load(f)
    config["network_protocol"]["hivemind-http-plugin"] = {"host": "127.0.0.1", "port": port}
    with open(path, "w") as f:
        json.dump(config, f)
    return port


def wait_http(hub: HubProcess, port: int) -> None:
    """Until the started hub's HTTP listener accepts connections."""
    wait_listening(port, 30, hub.proc, "the hub's HTTP protocol")


class RecordingSatellite:
    """What a test satellite does with its hivemind-bus-client client (`self.client`, its
    `on(HiveMessageType.BUS, self._on_bus)` handler set): it records every BUS message the hub
    sends it, with the time it arrived, and sends utterances under a session of its choice."""

    def _start_recording(self) -> None:
        from hivemind_bus_client.message import HiveMessageType
        self.received = []       # (time.monotonic(), message as a dict)
        self._lock = threading.Lock()
        self.client.on(HiveMessageType.BUS, self._on_bus)

    def _on_bus(self, hive_message) -> None:
        message = hive_message.payload
        if hasattr(message, "serialize"):
            message = json.loads(message.serialize())
        elif isinstance(message, str):
            message = json.loads(message)
        message = {"type": message.get("type") or message.get("msg_type"),
                   "data": message.get("data") or {}, "context": message.get("context") or {}}
        with self._lock:
            self.received.append((time.monotonic(), message))

    def mark(self) -> int:
        with self._lock:
            return len(self.received)

    def messages(self, since: int = 0):
        with self._lock:
            return [m for _, m in self.received[since:]]

    def timed(self, since: int = 0):
        with self._lock:
            return list(self.received[since:])

    def emit(self, msg_type: str, data=None, context=None) -> None:
        from ovos_bus_client.message import Message
        self.client.emit(Message(msg_type, data or {}, context or {}))

    def say(self, utterance: str, session_id: str, lang: str = "en-US",
            topic: str = "recognizer_loop:utterance") -> None:
        self.emit(topic, {"utterances": [utterance], "lang": lang},
                  {"session": {"session_id": session_id, "lang": lang}})

    def until(self, condition, timeout: float = 30.0, since: int = 0):
        from waiting import wait_until
        wait_until(lambda: condition(self.messages(since)), timeout)
        return self.messages(since)

    def until_handled(self, count: int = 1, timeout: float = 30.0, since: int = 0,
                      session_id: Optional[str] = None):
        def done(got):
            return sum(m["type"] == HANDLED and
                       (session_id is None or session_of(m) == session_id)
                       for m in got) >= count
        return self.until(done, timeout, since)


class HttpSatellite(RecordingSatellite):
    """hivemind-bus-client's `HiveMindHTTPClient` connected (Noise handshake over HTTP) with
    one access key; its identity (and Noise static key) in a folder of its own."""

    def __init__(self, http_port: int, creds, name: str = "http-sat",
                 home: Optional[str] = None):
        """`home`: the identity folder of an earlier satellite of the same access key (the hub
        pinned that key's Noise static key)."""
        from hivemind_bus_client.http_client import HiveMindHTTPClient
        from hivemind_bus_client.identity import NodeIdentity
        from json_database import JsonStorage
        self.home = home or tempfile.mkdtemp(prefix="hm-test-http-sat-")
        identity = NodeIdentity(identity_file=JsonStorage(os.path.join(self.home,
                                                                       "_identity.json")))
        self.client = HiveMindHTTPClient(key=creds.key, password=creds.password,
                                         host="http://127.0.0.1", port=http_port,
                                         useragent=name, identity=identity)
        self._start_recording()
        self.client.connect()
        if not self.client.handshake_event.is_set():
            raise RuntimeError("no handshake with the hub over HTTP")

    def close(self) -> None:
        self.client.shutdown()
        try:
            self.client.disconnect()
        except Exception:   # noqa: BLE001 - the hub may be gone already
            pass


class WsSatellite(RecordingSatellite):
    """hivemind-bus-client's websocket client on the same hub (its websocket port), recording
    the same way."""

    def __init__(self, creds, name: str = "ws-sat"):
        from hivemind_bus_client.client import HiveMessageBusClient
        from raw_satellite import satellite_identity
        self.client = HiveMessageBusClient(key=creds.key, password=creds.password,
                                           host="ws://127.0.0.1", port=creds.port,
                                           useragent=name, identity=satellite_identity())
        self.client.connect()
        self._start_recording()

    def close(self) -> None:
        self.client.close()


def session_of(message) -> Optional[str]:
    return ((message.get("context") or {}).get("session") or {}).get("session_id")


def spoken(messages, session_id: Optional[str] = None):
    """The sentences of the `speak` messages (of one session)."""
    return [m["data"].get("utterance") for m in messages if m["type"] == SPEAK and
            (session_id is None or session_of(m) == session_id)]
