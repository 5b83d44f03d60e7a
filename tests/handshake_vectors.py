"""The hub side of both generations' key exchanges, without sockets, for the tests that need
one: the HELLO and offer a 5.x hub sends, the client's exchange inputs, and `NoiseHub`, the
responder of protocol v3 built from the same library hivemind-core 5.x uses
(hivemind_bus_client.noise)."""
from hivemind_bus_client.message import HiveMessage
from hivemind_bus_client.noise import (
    NoiseTransport,
    build_prologue,
    canonical_json,
    noise_protocol_name,
    start_noise_handshake,
)

from hivemind_chat_agent.client.noise_keys import NoiseKeyring, cached_psk
from hivemind_chat_agent.core.exchange import ExchangeInputs

PASSWORD = "correct horse battery staple"
HELLO_5 = {"pubkey": "ab" * 16, "peer": "x::1::y::s", "node_id": "hub-node-1"}
OFFER_5 = {"max_protocol_version": 3, "binarize": False, "encodings": ["JSON-B64"],
           "ciphers": ["AES-GCM"], "noise": {"patterns": ["XXpsk2"],
                                             "suites": ["25519_ChaChaPoly_SHA256"]}}
OFFER_4 = {"handshake": True, "min_protocol_version": 0, "max_protocol_version": 1,
           "binarize": False, "preshared_key": False, "password": True, "crypto_required": True,
           "encodings": ["JSON-B64"], "ciphers": ["AES-GCM"]}


def inputs(tmp_path, password=PASSWORD, address="127.0.0.1:5678", max_bytes=1 << 20):
    """The client's inputs; the PSK derived once per password, as the client does."""
    return ExchangeInputs(password=password, hub_address=address,
                          noise_keys=NoiseKeyring(str(tmp_path), "key-1"),
                          encodings=("JSON-B64",), ciphers=("AES-GCM",),
                          max_message_bytes=max_bytes, psk=cached_psk)


class NoiseHub:
    """The responder side of protocol v3 as hivemind-core 5.x runs it."""

    def __init__(self, tmp_path, password=PASSWORD):
        name = noise_protocol_name("XXpsk2", "25519_ChaChaPoly_SHA256")
        self.hs = start_noise_handshake(
            initiator=False, pattern="XXpsk2", suite="25519_ChaChaPoly_SHA256",
            password=None, psk=cached_psk(password, HELLO_5["node_id"]),
            node_id=HELLO_5["node_id"],
            prologue=build_prologue(HELLO_5, OFFER_5, name),
            key_path=str(tmp_path / "hub.key"))
        self.transport = None

    def answer(self, first: HiveMessage) -> dict:
        self.hs.read_message(bytes.fromhex(first.payload["noise"]["msg"]))
        return {"noise": {"msg": self.hs.write_message(
            canonical_json({"encoding": "JSON-B64"})).hex()}}

    def finish(self, last: HiveMessage):
        self.hs.read_message(bytes.fromhex(last.payload["noise"]["msg"]))
        self.transport = NoiseTransport(self.hs)

    def send(self, text: str):
        frames = []
        self.transport.send_message(text, frames.append)
        return frames
