"""Who sent a satellite's BUS message, as the hub plugin acts on it: the connection, its name,
the Session it declared and the engine session that is.

hivemind-core has checked the message's key, type and session before it reaches the plugin;
what is left here is the plugin's own view: a connection of a generation it knows (4.x or
5.x, hub/dialects.py), encrypted under the connection's key, a declared session id within
core/limits.MAX_ID_BYTES. The engine session id is the declared one keyed with the access key
and the hub secret (core/satellites.py), so a satellite's conversation is the same on 4.x and
5.x hubs, across reconnects and across replicas sharing a store.
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ovos_bus_client.message import Message
from ovos_utils.log import LOG

from hivemind_chat_agent.core.limits import id_refusal, shown_name
from hivemind_chat_agent.core.satellites import engine_session_id
from hivemind_chat_agent.errors import IdentifierTooLongError
from hivemind_chat_agent.hub.dialects import dialect_for
from hivemind_chat_agent.hub.refusal_log import warn_refusal


@dataclass(frozen=True)
class Sender:
    """An authenticated satellite's message, as the plugin answers it."""
    client: Any                  # hivemind-core's connection object: replies go to it
    peer: str                    # its name when it sent this (logs, the reply's destination)
    satellite_session: Dict[str, Any]   # the Session it declared, under its declared id
    session_id: str              # the engine session that is


def sender_of(message: Message) -> Tuple[str, Dict[str, Any]]:
    """(peer, Session as sent) of a message whose satellite was not looked up."""
    sat_session = message.context.get("session")
    return (message.context.get("peer") or message.context.get("source"),
            sat_session if isinstance(sat_session, dict) else {"session_id": "default"})


def identify(clients: Mapping[str, Any], secret: Callable[[], bytes], message: Message,
             what: str) -> Optional[Sender]:
    """The sender of a satellite's message, or None (logged) for one not to act on.
    IdentifierTooLongError for a declared session id over core/limits.MAX_ID_BYTES or not
    UTF-8 (nothing of it is kept); `secret()`'s ConversationStoreError when the store holding
    the hub secret is down."""
    peer = message.context.get("peer") or message.context.get("source")
    client = clients.get(peer)
    if client is None:
        LOG.info(f"ignoring {what} from {shown_name(peer)}: no such satellite is connected")
        return None
    dialect = dialect_for(client)
    if dialect is None:
        warn_refusal("unknown generation", peer,
                     f"refusing {what} from {shown_name(peer)}: its connection "
                     f"({type(client).__name__}) is of no hivemind-core generation this "
                     "plugin knows (4.x or 5.x); nothing is answered")
        return None
    if not dialect.authenticated(client):
        warn_refusal("unauthenticated", peer,
                     f"refusing {what} from {shown_name(peer)}: it was not encrypted under "
                     "the connection's key (the sender knows the access key, not the "
                     "password); nothing is answered")
        return None
    sat_session = message.context.get("session")
    if not isinstance(sat_session, dict) or not isinstance(sat_session.get("session_id"),
                                                            str):
        sat_session = {"session_id": "default"}
    # keyed by the id the satellite declared, so its engine session is the same on 4.x
    # and 5.x hubs (and across an upgrade); replies carry that id back
    declared = dialect.declared_session_id(client, sat_session["session_id"])
    refusal = id_refusal("session id", declared)
    if refusal:
        raise IdentifierTooLongError(refusal)
    sat_session = dict(sat_session, session_id=declared)
    return Sender(client, peer, sat_session, engine_session_id(secret(), client.key, declared))
