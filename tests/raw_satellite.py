"""Stock satellites for the real-hub tests: hivemind-bus-client's own HiveMessageBusClient
(what a device runs), recording every BUS message it receives, and `send_raw` for frames the
library would repair before sending. One HiveMind identity (and Noise static key) for all of
them, in a temporary home: 5.x pins each access key's first key, and the user's own
~/.config/hivemind stays untouched.

HUB_GENERATIONS: the generations such a satellite reaches from this venv (a venv holding
hivemind-core 4.x has a 4.x library: 4.0 hubs only), of those HIVEMIND_CHAT_GENERATIONS asks for."""
import importlib.metadata
import json
import os
import sys
import tempfile
import threading

from hivemind_bus_client.client import HiveMessageBusClient
from hivemind_bus_client.identity import NodeIdentity
from hubs import GENERATIONS, hub_generations
from json_database import JsonStorage
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from waiting import hold_still

LOCAL_GENERATION = "4.0" if importlib.metadata.version("hivemind-core").startswith("4.") \
    else "5"
if LOCAL_GENERATION == "4.0":      # this venv is a 4.0 hub's: its hubs run from it
    os.environ.setdefault("HIVEMIND_CHAT_VENV_HUB_4_0", sys.prefix)
HUB_GENERATIONS = tuple(g for g in (("4.0",) if LOCAL_GENERATION == "4.0" else GENERATIONS)
                        if g in hub_generations())

_SATELLITE_HOME = tempfile.mkdtemp(prefix="hm-test-satellite-")


def satellite_identity() -> NodeIdentity:
    return NodeIdentity(identity_file=JsonStorage(os.path.join(_SATELLITE_HOME,
                                                               "_identity.json")))


class RawSatellite:
    """A plain hivemind-bus-client satellite that records every BUS message it receives."""

    def __init__(self, creds):
        self.client = HiveMessageBusClient(key=creds.key, password=creds.password,
                                           host="ws://127.0.0.1", port=creds.port,
                                           useragent="raw-satellite",
                                           identity=satellite_identity())
        self.received = []
        self.handled = threading.Event()
        self.client.connect()
        self.client.on_mycroft("message", self._on_any)

    def _on_any(self, raw):
        msg = Message.deserialize(raw) if isinstance(raw, str) else raw
        self.received.append(msg.msg_type)
        if msg.msg_type == "ovos.utterance.handled":
            self.handled.set()

    def ask(self, text, wait=5.0):
        """The BUS types answering `text`, once `ovos.utterance.handled` came and a UNIT more
        showed nothing after it (anything after it would be a bug)."""
        self.received.clear()
        self.handled.clear()
        self.client.emit(Message("recognizer_loop:utterance", {"utterances": [text]},
                                 {"session": Session(self.client.session_id).serialize()}))
        assert self.handled.wait(wait)
        hold_still()
        return [t for t in self.received if t != "recognizer_loop:utterance"]

    def connected(self):
        """The library forgets its session key (4.x) or Noise transport (5.x) on close."""
        return self.client.crypto_key is not None or \
            getattr(self.client, "noise_transport", None) is not None

    def close(self):
        self.client.close()


def send_raw(sat, payload):
    """A BUS frame exactly as given, encrypted as the connection's own frames are (Noise on
    5.x, the session key on 4.x): the library's emit() would repair the context first."""
    from hivemind_bus_client.encryption import encrypt_as_json
    from websocket import ABNF
    c = sat.client
    frame = json.dumps({"msg_type": "bus", "payload": payload})
    if getattr(c, "noise_transport", None) is not None:
        c.noise_transport.send_message(frame, lambda b: c.client.send(b, ABNF.OPCODE_BINARY))
    else:
        c.client.send(encrypt_as_json(c.crypto_key, frame, cipher=c.cipher,
                                      encoding=c.json_encoding))
