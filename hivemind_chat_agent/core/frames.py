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
from typing import Any, Optional

from hivemind_bus_client.encryption import decrypt_bin, decrypt_from_json
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hivemind_bus_client.serialization import decode_bitstring

PLAIN_TYPES = (HiveMessageType.HELLO, HiveMessageType.HANDSHAKE)


class Verdict(str, Enum):
    OK = "ok"
    DROP = "drop"            # ignore it, the connection stays trusted
    TAMPERED = "tampered"    # failed authentication: close the connection
    TOO_LARGE = "too_large"  # over max_frame_bytes: close the connection


@dataclass(frozen=True)
class Opened:
    verdict: Verdict
    message: Optional[HiveMessage] = None
    why: str = ""


def open_frame(raw: Any, key: Optional[bytes], cipher: Any, encoding: Any,
               max_bytes: int) -> Opened:
    """One frame from the hub in, a HiveMessage or a verdict with its reason out."""
    if not isinstance(raw, (str, bytes)):
        return Opened(Verdict.DROP, why="not a text or binary frame")
    if len(raw) > max_bytes:
        return Opened(Verdict.TOO_LARGE, why=f"a frame of {len(raw)} bytes")
    if not key:
        return _plain_handshake(raw)
    if isinstance(raw, bytes):
        try:
            return _message(decode_bitstring(decrypt_bin(key, raw, cipher=cipher)))
        except Exception as e:
            return Opened(Verdict.TAMPERED, why=f"binary frame failed authentication "
                                                f"({type(e).__name__})")
    try:
        envelope = json.loads(raw)
    except ValueError:     # neither ciphertext nor a message: a frame garbled on the way
        return Opened(Verdict.TAMPERED, why="a frame that is neither ciphertext nor JSON")
    if not isinstance(envelope, dict) or "ciphertext" not in envelope:
        return Opened(Verdict.DROP, why="unencrypted frame after the handshake")
    try:
        plain = decrypt_from_json(key, raw, cipher=cipher, encoding=encoding)
    except Exception as e:
        return Opened(Verdict.TAMPERED, why=f"frame failed authentication ({type(e).__name__})")
    try:
        return _message(json.loads(plain))
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
