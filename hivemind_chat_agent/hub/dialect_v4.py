"""The reply path to a satellite of a hivemind-core 4.x hub (password handshake, AES session key).

A 4.x connection object (`HiveMindClientConnection`) carries the handshake's session key
(`crypto_key`, `cipher`, `encoding`, `binarize`) and a `msg_blacklist`; whoever answers encrypts.
4.0 also decodes plain-text frames from any connection that presented a valid access key, so
this dialect marks each decoded frame as ciphertext or not (`watch_frames`) and counts a satellite
as authenticated only while the frame being handled was ciphertext.
"""
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from ovos_utils.log import LOG

from hivemind_chat_agent import compat
from hivemind_chat_agent.errors import ReplyNotSent

_ENCRYPTED_MARK = "_hivemind_chat_encrypted"


def fits(client) -> bool:
    """A connection with a password-handshake session key (hivemind-core 4.x)."""
    return hasattr(client, "crypto_key")


def authenticated(client) -> bool:
    """Did the frame being handled arrive as ciphertext that decrypted under the connection's
    key (so its sender knows the password-derived or pre-shared secret)?

    hivemind-core 4.0 decodes plain-text frames from any connection that presented a valid
    access key, before or after a handshake, and never checks the password envelope: a
    satellite that knows only the access key reaches the agent protocol. Core does not tell an
    agent protocol how a message arrived, so `watch_frames()` marks each connection as its
    frames are decoded. A connection we cannot tell about counts as unproven."""
    return getattr(client, _ENCRYPTED_MARK, False) is True


def declared_session_id(client, session_id: str) -> str:
    """4.x hands the agent the session id the satellite declared (its HELLO's)."""
    return session_id


def send(client, reply: Message) -> None:
    """What hivemind-core 4.x's `HiveMindClientConnection.send` does for a BUS message, minus
    its four LOG.debug calls per message (ovos_utils walks the call stack on each, filtered or
    not: about a quarter of the hub's CPU per turn) and minus its plain-text fallback: a reply
    to a connection without a session key is refused (`ReplyNotSent`), never sent in clear."""
    from hivemind_bus_client.encryption import encrypt_as_json, encrypt_bin
    from hivemind_bus_client.serialization import get_bitstring
    if reply.msg_type in (getattr(client, "msg_blacklist", None) or ()):
        raise ReplyNotSent(f"{reply.msg_type} is in the client's message blacklist")
    if not client.crypto_key:
        raise ReplyNotSent("the connection has no session key (no completed handshake)")
    message = HiveMessage(HiveMessageType.BUS, payload=reply)
    if client.binarize:
        frame = encrypt_bin(key=client.crypto_key, cipher=client.cipher,
                            plaintext=get_bitstring(hive_type=message.msg_type, payload=reply,
                                                    hivemeta=message.metadata,
                                                    binary_type=message.bin_type).bytes)
        write_frame(client, frame, True)
    else:
        write_frame(client, encrypt_as_json(key=client.crypto_key, plaintext=message.serialize(),
                                            cipher=client.cipher, encoding=client.encoding),
                    False)


def write_frame(client, frame, binary: bool) -> None:
    """Write through the connection's tornado handler and consume the write's outcome.

    hivemind-core's `send_msg` drops the Future of `write_message`; when the satellite's socket
    closes while a frame is in flight, that Future fails and asyncio later logs "Task exception
    was never retrieved" with a traceback, once per frame. The handler is the one `send_msg`
    closes over (hivemind-websocket-protocol); without it, `send_msg` is used as is."""
    handler = compat.socket_handler(getattr(client, "send_msg", None))
    if handler is None:
        client.send_msg(frame, binary)
        return
    future = handler.write_message(frame, binary)
    if future is not None and hasattr(future, "add_done_callback"):
        future.add_done_callback(_consume_write)


def _consume_write(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        LOG.debug(f"a reply was not delivered: the satellite's socket closed "
                  f"({type(future.exception()).__name__})")


def install() -> None:
    """Mark each decoded frame as ciphertext or not (compat.watch_v4_decoding), once per
    process. Nothing is wrapped on a core whose connections have no `crypto_key` (5.x: Noise
    only, core itself refuses clear frames)."""
    compat.watch_v4_decoding(_mark)


def _mark(client, payload) -> None:
    """After `decode`: was this frame ciphertext under the connection's key? (None: a frame
    being decoded, unproven until it is.)"""
    setattr(client, _ENCRYPTED_MARK, payload is not None and
            bool(getattr(client, "crypto_key", None)) and
            (isinstance(payload, bytes) or
             (isinstance(payload, str) and "ciphertext" in payload)))
