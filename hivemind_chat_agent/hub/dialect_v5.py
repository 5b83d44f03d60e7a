"""The reply path to a satellite of a hivemind-core 5.x hub (protocol v3, Noise).

A 5.x connection object carries a `noise_transport` once the Noise handshake is done and no
session key of its own. Core closes a connection with 1008 on any frame after the handshake
that is not a valid Noise transport message, so a message from a connection whose transport is
set was sent by the holder of the handshake's keys. `client.send(HiveMessage)` encrypts under
the connection's own lock (Noise nonces must go out in order, whichever thread sends) and
restores the satellite's own session id (core namespaces non-admin ids as `<16 hex>:<id>`).
"""
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message

from hivemind_chat_agent.errors import ReplyNotSent


def fits(client) -> bool:
    """A connection that speaks Noise (5.x), or will: a core whose connections also carry a
    password-handshake key (4.x pre-releases with v3) counts as 5.x only once Noise is up."""
    return hasattr(client, "noise_transport") and (
        client.noise_transport is not None or not hasattr(client, "crypto_key"))


def authenticated(client) -> bool:
    return getattr(client, "noise_transport", None) is not None


def declared_session_id(client, session_id: str) -> str:
    """The id the satellite declared. 5.x core hands a non-admin's session to the agent as
    `<session_namespace>:<declared>` (the namespace is a 16-hex digest of the node and client
    ids, the same across reconnects) and restores the declared id in what `client.send`
    writes; an admin's ids arrive as declared."""
    try:
        prefix = f"{client.session_namespace}:"
    except Exception:     # no database at hand: core falls back to a per-connection nonce
        return session_id
    declared = session_id[len(prefix):] if session_id.startswith(prefix) else ""
    return declared or session_id


def send(client, reply: Message) -> None:
    if getattr(client, "noise_transport", None) is None:
        raise ReplyNotSent("the connection has no Noise session (handshake not finished)")
    if getattr(client, "disconnected", False):
        raise ReplyNotSent("the connection is closing")
    client.send(HiveMessage(HiveMessageType.BUS, payload=reply))


def install() -> None:
    """Nothing to hook: 5.x core authenticates every frame itself."""
