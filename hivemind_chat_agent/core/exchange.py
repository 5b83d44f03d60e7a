"""What every key exchange with a hub and the channel it yields must do, whichever generation
the hub speaks (`handshake_password` for 4.x, `handshake_noise` for 5.x; `handshake.choose` picks
one). The connection drives either through `KeyExchange`; once it completes, a `SecureChannel`
seals what we send and opens what the hub sends. Nothing here does I/O.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from hivemind_bus_client.message import HiveMessage, HiveMessageType

from hivemind_chat_agent.core.frames import Opened
from hivemind_chat_agent.errors import ConnectionLostError

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


def frames_to_send(message_type: Any, text: str, channel: Optional[SecureChannel]
                   ) -> List[Frame]:
    """The frames that carry one serialized message (`text`, of HiveMessageType
    `message_type`) to the hub, whatever carries them (a websocket, an MQTT topic).

    A HANDSHAKE goes in the clear, as one text frame: the exchange runs before any channel
    exists. Anything else goes sealed by `channel`, which the caller reads once, under the
    lock it writes under, and passes here: the reading thread may clear it meanwhile (the hub
    went away), and a Noise channel's frames must reach the hub in the order they were sealed.
    With no channel, ConnectionLostError: nothing may ever go in plain text after the
    handshake."""
    if message_type == HiveMessageType.HANDSHAKE:
        return [(text, False)]
    if channel is None:
        raise ConnectionLostError("refusing to send before the connection is encrypted; the "
                                  "handshake did not complete")
    return channel.seal(text)
