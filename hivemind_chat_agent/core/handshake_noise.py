"""hivemind-core 5.x: HiveMind protocol v3, the Noise XXpsk2 handshake, and its channel.

The cryptography is hivemind-bus-client's (`hivemind_bus_client.noise`, on poorman-handshake's
Noise primitive); this module only drives it. What it adds for a chat client:

* the PSK (argon2id of the password) comes from `ExchangeInputs.psk`, which the client keeps
  in memory only (client/noise_keys.py): hivemind-bus-client's disk cache is keyed by access
  key, so a wrong or rotated password would go unnoticed for as long as the old key is cached;
* the client's static key is one per access key (a 5.x hub pins it; `NoiseKeyring`), and the
  hub's static key is pinned by address on first use: a different key later is refused;
* we always choose XXpsk2 and check the pin ourselves, so a hub that lost our key (reinstalled)
  costs no failed KKpsk0 round first.
"""
from typing import Any, Dict, List, Optional, Tuple

from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hivemind_bus_client.noise import (
    NOISE_PATTERN_XX,
    NoiseTransport,
    NoiseTransportFailed,
    build_prologue,
    canonical_json,
    noise_protocol_name,
    select_noise_options,
    start_noise_handshake,
)
from poorman_handshake.noise import derive_psk

from hivemind_chat_agent.core.exchange import ExchangeInputs, Frame, KeyExchange, SecureChannel
from hivemind_chat_agent.core.frames import Opened, Verdict, message_from_json
from hivemind_chat_agent.errors import HubKeyChangedError, UnsupportedHubError, WrongPasswordError


def _derive(password: str, node_id: str) -> bytes:
    psk: bytes = derive_psk(password, node_id=node_id)
    return psk


class NoiseExchange(KeyExchange):
    generation = "5.x (protocol v3, Noise)"

    def __init__(self, hello: Dict[str, Any], offer: Dict[str, Any], inputs: ExchangeInputs):
        if inputs.noise_keys is None:
            raise UnsupportedHubError("the hub speaks only the Noise handshake and this "
                                      "connection has no place for its Noise key")
        noise = offer.get("noise") or {}
        picked = select_noise_options(list(noise.get("patterns") or []),
                                      list(noise.get("suites") or []), None)
        if picked is None:
            raise UnsupportedHubError(
                f"the hub offers Noise patterns {noise.get('patterns')} and suites "
                f"{noise.get('suites')}, none of which this client speaks ({NOISE_PATTERN_XX} "
                "with 25519_ChaChaPoly_SHA256 or 25519_AESGCM_SHA256); update "
                "hivemind-bus-client")
        self._pattern, self._suite = picked
        self._inputs = inputs
        self._node_id = str(hello.get("node_id") or "")
        self._prologue = build_prologue(hello, offer, noise_protocol_name(*picked))
        self._hs = None

    def first(self) -> HiveMessage:
        keys = self._inputs.noise_keys
        self._hs = handshake = start_noise_handshake(
            initiator=True, pattern=self._pattern, suite=self._suite, password=None,
            node_id=self._node_id, prologue=self._prologue, key_path=keys.ensure(),
            psk=(self._inputs.psk or _derive)(self._inputs.password, self._node_id))
        hello = canonical_json({"binarize": False, "encodings": list(self._inputs.encodings)})
        return HiveMessage(HiveMessageType.HANDSHAKE, {"noise": {
            "pattern": self._pattern, "suite": self._suite,
            "msg": handshake.write_message(hello).hex()}})

    def receive(self, payload: Dict[str, Any]
                ) -> Tuple[List[HiveMessage], Optional[SecureChannel]]:
        noise = payload.get("noise")
        if self._hs is None or not isinstance(noise, dict) or "msg" not in noise:
            return [], None            # a repeated offer, not the answer
        try:
            self._hs.read_message(bytes.fromhex(str(noise["msg"])))
        except Exception:
            raise WrongPasswordError(
                "the hub's Noise handshake does not match this password: the password is "
                "wrong for this access key (or someone altered the handshake on the way); "
                "check it or re-register with `hivemind-core add-client`") from None
        send = []
        if not self._hs.handshake_finished:      # XXpsk2: our static key, the last message
            send.append(HiveMessage(HiveMessageType.HANDSHAKE,
                                    {"noise": {"msg": self._hs.write_message(b"").hex()}}))
        transport = NoiseTransport(self._hs, max_reassembly_bytes=self._inputs.max_message_bytes)
        keys, address = self._inputs.noise_keys, self._inputs.hub_address
        pinned = keys.pinned(address)
        if pinned and pinned != transport.remote_static_key:
            raise HubKeyChangedError(
                f"the hub at {address} presented a Noise key other than the one this client "
                f"pinned at its first connection: another machine may be answering there. If "
                f"the hub was reinstalled, remove its line from {keys.pins_path} and connect "
                "again")
        if not pinned and transport.remote_static_key:
            keys.pin(address, transport.remote_static_key)
        return send, NoiseChannel(transport)


class NoiseChannel(SecureChannel):
    """Noise transport messages, one sequential nonce per direction: frames must be written in
    the order they were sealed (the connection seals and writes under one lock)."""
    generation = NoiseExchange.generation
    many_sessions = True    # 5.x reads the Session of every message (from 4.13.18a1)

    def __init__(self, transport: NoiseTransport):
        self._transport = transport

    def seal(self, text: str) -> List[Frame]:
        frames: List[Frame] = []
        self._transport.send_message(text, lambda data: frames.append((data, True)))
        return frames

    def open(self, raw: Any) -> Opened:
        if not isinstance(raw, bytes):
            return Opened(Verdict.DROP, why="unencrypted frame after the handshake")
        try:
            plain = self._transport.decrypt_frame(raw)
        except NoiseTransportFailed as e:
            if "reassembly exceeded" in str(e):
                return Opened(Verdict.TOO_LARGE, why="a message larger than max_frame_bytes")
            return Opened(Verdict.TAMPERED, why="frame failed authentication "
                                                "(NoiseTransportFailed)")
        if plain is None:
            return Opened(Verdict.MORE, why="part of a longer message")
        if isinstance(plain, bytes):
            return Opened(Verdict.DROP, why="a binary message (we asked for none)")
        return message_from_json(plain)
