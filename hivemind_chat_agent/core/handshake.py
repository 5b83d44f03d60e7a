"""The key exchange with a hub, chosen from the hub's first HANDSHAKE, behind one interface.

A hivemind-core 4.x hub offers the password handshake (both sides prove the password with an
envelope and derive an AES-GCM or ChaCha20 key; `handshake_password`). A 5.x hub offers only
protocol v3, the Noise XXpsk2 handshake (`handshake_noise`). The connection drives either
through `KeyExchange`; once it completes, a `SecureChannel` seals what we send and opens what
the hub sends. Nothing here does I/O, so every step is testable without a socket.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from hivemind_bus_client.message import HiveMessage

from hivemind_chat_agent.core.frames import Opened
from hivemind_chat_agent.errors import (AuthenticationError, HubKeyChangedError,
                                        UnsupportedHubError)

Frame = Tuple[Union[str, bytes], bool]     # (data, is_binary)


class SecureChannel(ABC):
    """An established session: every frame after the handshake goes through it."""

    generation = ""
    # the hub honours the Session each message declares, so one connection may carry many
    many_sessions = False

    @abstractmethod
    def seal(self, text: str) -> List[Frame]:
        """A serialized HiveMessage in, the websocket frames that carry it out."""

    @abstractmethod
    def open(self, raw: Any) -> Opened:
        """One frame from the hub in, a message or a verdict with its reason out."""


class KeyExchange(ABC):
    """One generation's handshake, fed the hub's HANDSHAKE payloads."""

    generation = ""

    @abstractmethod
    def first(self) -> HiveMessage:
        """Our answer to the hub's offer."""

    @abstractmethod
    def receive(self, payload: Dict[str, Any]
                ) -> Tuple[List[HiveMessage], Optional[SecureChannel]]:
        """The hub's next HANDSHAKE in; what to send in the clear, and the channel once the
        exchange is complete. Raises an `AuthenticationError` when the hub fails to prove
        the password (or its pinned key)."""


@dataclass(frozen=True)
class ExchangeInputs:
    """What a key exchange needs: the client's secrets and where its Noise keys live."""
    password: str = field(repr=False)
    hub_address: str                   # host:port, the hub key's pin is kept under it
    noise_keys: Any = None             # NoiseKeyring (handshake_noise), None for no Noise
    encodings: Tuple[str, ...] = ()
    ciphers: Tuple[str, ...] = ()
    max_message_bytes: int = 1 << 20
    # (password, hub node id) -> the Noise PSK; the client passes one that remembers each
    # derivation (argon2id, about 0.3 s and 64 MiB), None derives it every time
    psk: Optional[Callable[[str, str], bytes]] = field(default=None, repr=False)


def offers_noise(offer: Dict[str, Any]) -> bool:
    """A protocol v3 offer (hivemind-core 5.x): the Noise parameters and version 3."""
    try:
        version = int(offer.get("max_protocol_version") or 0)
    except (TypeError, ValueError):
        version = 0
    return version >= 3 and isinstance(offer.get("noise"), dict)


def choose(hello: Dict[str, Any], offer: Dict[str, Any], inputs: ExchangeInputs) -> KeyExchange:
    """The exchange this hub speaks, from its cleartext HELLO and HANDSHAKE offer. Noise wins
    where a hub offers both, as in hivemind-bus-client: it is the one that pins keys."""
    if offers_noise(offer):
        try:
            from hivemind_chat_agent.core.handshake_noise import NoiseExchange
        except ImportError:   # hivemind-bus-client < 0.10.1a1 or poorman-handshake < 2
            raise UnsupportedHubError(
                "the hub speaks only HiveMind protocol v3 (the Noise handshake of "
                "hivemind-core 5.x) and this install has no Noise support; install "
                "hivemind-bus-client>=1.2.12a1 and poorman-handshake>=2.0.0a1") from None
        return NoiseExchange(hello, offer, inputs)
    keys = inputs.noise_keys
    if keys is not None and keys.pinned(inputs.hub_address):
        # a hub that spoke Noise to us offers only the password handshake, whose envelope is a
        # fast hash of the password: refused before it is sent (an attacker on the path strips
        # the Noise offer to crack the password offline)
        raise HubKeyChangedError(
            f"the hub at {inputs.hub_address} spoke the Noise handshake before and now offers "
            "only the password handshake: someone on the network may be downgrading the "
            "connection, so no password proof was sent. If the hub really went back to "
            f"hivemind-core 4.x, remove its line from {keys.pins_path}")
    if offer.get("password"):
        from hivemind_chat_agent.core.handshake_password import PasswordExchange
        return PasswordExchange(offer, inputs)
    raise AuthenticationError(
        "the hub has no password for this client, so no key can be derived; register it "
        "with `hivemind-core add-client --password ...`")
