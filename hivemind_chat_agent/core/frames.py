"""The gate every websocket frame from the hub passes before anything reads it, without I/O.

Before the session key exists only the hub's HELLO and HANDSHAKE are accepted, in plain text.
Once it exists, only ciphertext under that key is: a plain-text frame is dropped (a genuine hub
never sends one after the handshake, and on a `ws://` path anyone who can inject bytes could
otherwise forge the running turn's answer or overwrite its Session), and a frame that fails
authentication, or is not even JSON, means the stream was tampered with or garbled: a frame of
the answer may be gone, so the turn ends with an error and the connection is no longer trusted.
"""
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional, Protocol

from hivemind_bus_client.message import HiveMessage, HiveMessageType

PLAIN_TYPES = (HiveMessageType.HELLO, HiveMessageType.HANDSHAKE)


class Verdict(str, Enum):
    OK = "ok"
    DROP = "drop"            # ignore it, the connection stays trusted
    TAMPERED = "tampered"    # failed authentication: close the connection
    TOO_LARGE = "too_large"  # over max_frame_bytes: close the connection
    MORE = "more"            # one part of a longer message: keep reading


@dataclass(frozen=True)
class Opened:
    verdict: Verdict
    message: Optional[HiveMessage] = None
    why: str = ""


class Opener(Protocol):
    """What opens a frame after the handshake: a core.exchange.SecureChannel."""

    def open(self, raw: Any) -> "Opened":
        ...


def open_frame(raw: Any, channel: Optional[Opener], max_bytes: int) -> Opened:
    """One frame from the hub in, a HiveMessage or a verdict with its reason out. Before the
    handshake (`channel` None) only plain HELLO and HANDSHAKE pass; after it, the channel of
    whichever generation the hub speaks decides (core/handshake_password, handshake_noise)."""
    if not isinstance(raw, (str, bytes)):
        return Opened(Verdict.DROP, why="not a text or binary frame")
    if len(raw) > max_bytes:
        return Opened(Verdict.TOO_LARGE, why=f"a frame of {len(raw)} bytes")
    if channel is None:
        return _plain_handshake(raw)
    return channel.open(raw)


def message_from_json(text: Any) -> Opened:
    """The plaintext inside an authenticated frame: a HiveMessage, or dropped with the reason."""
    try:
        return _message(json.loads(text))
    except (ValueError, TypeError) as e:
        return Opened(Verdict.DROP, why=f"undecodable message inside a valid frame "
                                        f"({type(e).__name__})")


def _plain_handshake(raw: Any) -> Opened:
    if not isinstance(raw, str):
        return Opened(Verdict.DROP, why="binary frame before the handshake")
    try:
        opened = _message(json.loads(raw))
    except (ValueError, TypeError) as e:
        return Opened(Verdict.DROP, why=f"undecodable frame before the handshake "
                                        f"({type(e).__name__})")
    if opened.message is not None and opened.message.msg_type not in PLAIN_TYPES:
        return Opened(Verdict.DROP, why=f"{opened.message.msg_type} before the handshake")
    return opened


def _message(obj: Any) -> Opened:
    if isinstance(obj, HiveMessage):
        return Opened(Verdict.OK, obj)
    if not isinstance(obj, dict):
        return Opened(Verdict.DROP, why="message is not an object")
    try:
        return Opened(Verdict.OK, HiveMessage(**obj))
    except Exception as e:
        return Opened(Verdict.DROP, why=f"not a HiveMind message ({type(e).__name__})")
