"""hivemind-core 4.x: the password handshake (protocol v1/v2) and its AES-GCM/ChaCha20 channel.

Each side sends an envelope that proves the password; the key is derived from both. We send
ours first and check the hub's before deriving anything, so a wrong password is a typed error
and not an unreadable first answer.
"""
import json
from typing import Any, Dict, List, Optional, Tuple

from hivemind_bus_client.encryption import (
    SupportedCiphers,
    SupportedEncodings,
    decrypt_bin,
    decrypt_from_json,
    encrypt_as_json,
)
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hivemind_bus_client.serialization import decode_bitstring
from poorman_handshake import PasswordHandShake

from hivemind_chat_agent.core.exchange import ExchangeInputs, Frame, KeyExchange, SecureChannel
from hivemind_chat_agent.core.frames import Opened, Verdict, _message, message_from_json
from hivemind_chat_agent.errors import WrongPasswordError


def _password_handshake(password: str) -> PasswordHandShake:
    """poorman-handshake 2 refuses passwords it scores as guessable; the hub's operator chose
    this one and the hub accepts it, so refusing it here would only lock the client out."""
    try:
        return PasswordHandShake(password, min_bits=0)
    except TypeError:           # poorman-handshake 1.x has no strength check
        return PasswordHandShake(password)


class PasswordExchange(KeyExchange):
    generation = "4.x (password handshake)"

    def __init__(self, offer: Dict[str, Any], inputs: ExchangeInputs):
        self._inputs = inputs
        self._pswd = _password_handshake(inputs.password)

    def first(self) -> HiveMessage:
        return HiveMessage(HiveMessageType.HANDSHAKE, {
            "binarize": False, "encodings": list(self._inputs.encodings),
            "ciphers": list(self._inputs.ciphers),
            "envelope": self._pswd.generate_handshake()})

    def receive(self, payload: Dict[str, Any]
                ) -> Tuple[List[HiveMessage], Optional[SecureChannel]]:
        envelope = payload.get("envelope")
        if envelope is None:          # a repeated offer, not the answer
            return [], None
        try:
            valid = isinstance(envelope, str) and self._pswd.verify(envelope)
        except Exception:
            valid = False
        if not valid:
            raise WrongPasswordError(
                "the hub's handshake does not match this password: the password is wrong for "
                "this access key; check it or re-register with `hivemind-core add-client`")
        self._pswd.receive_handshake(envelope)
        return [], PasswordChannel(self._pswd.secret,
                                   payload.get("cipher") or SupportedCiphers.AES_GCM,
                                   payload.get("encoding") or SupportedEncodings.JSON_HEX)


class PasswordChannel(SecureChannel):
    """Frames sealed with the derived key; a 4.x hub binds one Session to a connection."""
    generation = PasswordExchange.generation

    def __init__(self, key: bytes, cipher: Any, encoding: Any):
        self.key, self.cipher, self.encoding = key, cipher, encoding

    def seal(self, text: str) -> List[Frame]:
        return [(encrypt_as_json(self.key, text, cipher=self.cipher, encoding=self.encoding),
                 False)]

    def open(self, raw: Any) -> Opened:
        if isinstance(raw, bytes):
            try:
                return _message(decode_bitstring(decrypt_bin(self.key, raw, cipher=self.cipher)))
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
            plain = decrypt_from_json(self.key, raw, cipher=self.cipher, encoding=self.encoding)
        except Exception as e:
            return Opened(Verdict.TAMPERED, why=f"frame failed authentication "
                                                f"({type(e).__name__})")
        return message_from_json(plain)
