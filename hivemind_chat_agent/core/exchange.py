"""What every key exchange with a hub and the channel it yields must do, whichever generation
the hub speaks (`handshake_password` for 4.x, `handshake_noise` for 5.x; `handshake.choose` picks
one). The connection drives either through `KeyExchange`; once it completes, a `SecureChannel`
seals what we send and opens what the hub sends. Nothing here does I/O.
"""
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from hivemind_bus_client.message import HiveMessage

from hivemind_chat_agent.core.frames import Opened

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
