"""How a reply reaches a satellite: one dialect per hivemind-core generation, chosen per
connection (a dialect is the hub side's word; the client's `HubLink` is another thing).

hivemind-core 4.x connections carry the password handshake's session key and leave encryption to
whoever writes (`dialect_v4`); 5.x connections carry a Noise transport and encrypt in their own
`send` (`dialect_v5`). Everything generation-specific about answering a satellite lives in those
two modules, behind the same four names:

    fits(client) -> bool            is this connection object of that generation?
    authenticated(client) -> bool   was the message being handled proven to come from the key's
                                    holder (not merely someone who knows the access key)?
    declared_session_id(client, sid)  the session id the satellite itself declared, from the
                                    one core handed the agent (5.x namespaces it)
    send(client, reply: Message)    encrypt and write one BUS reply, or raise ReplyNotSent
    install()                       process-wide hooks, idempotent

The dialect is picked once per connection, from what the object has, and kept on it.
"""
import time
from types import ModuleType
from typing import Callable, Optional

from ovos_utils.log import LOG

from hivemind_chat_agent import compat
from hivemind_chat_agent.core.limits import shown, shown_name
from hivemind_chat_agent.errors import ReplyNotSent
from hivemind_chat_agent.hub.connections import connection_closed
from hivemind_chat_agent.hub.refusal_log import warn_refusal

_DIALECT_ATTR = "_hivemind_chat_dialect"


def _dialects():
    from hivemind_chat_agent.hub import dialect_v4, dialect_v5
    return (dialect_v5, dialect_v4)     # a 4.x pre-release with a Noise session counts as 5.x


def install_dialects() -> None:
    for dialect in _dialects():
        dialect.install()


def dialect_for(client) -> Optional[ModuleType]:
    """The dialect module for this connection, or None for a connection object of no known
    generation (the caller refuses it, with a warning)."""
    dialect = getattr(client, _DIALECT_ATTR, None)
    if dialect is None:
        dialect = next((candidate for candidate in _dialects() if candidate.fits(client)), None)
        if dialect is not None:
            try:
                setattr(client, _DIALECT_ATTR, dialect)
            except AttributeError:    # a slotted object: choose again next time
                pass
    return dialect


def _warn_not_sent(peer: str, line: str) -> None:
    """A reply that could not go out: a WARNING within the sender's line budget
    (hub/refusal_log.py), since an answer that outlives its satellite has a line for each of
    its sentences (30-54 for one answer over HTTP and websocket alike)."""
    warn_refusal("not sent", peer, line)


def send_reply(client, peer: str, reply,
               not_sent: Optional[Callable[[str], None]] = None) -> None:
    """IO loop: write `reply` (a Message) to the connection `client`, by the object, not by its
    peer name (a satellite's HELLO renames a connection on 5.x while it stays). A reply that
    cannot go out is logged with the reason, never silence: one to a connection gone or of no
    known generation through `not_sent` (default: a WARNING within the sender's line budget),
    any other failure as a WARNING. The write's time is
    charged to the connection's share of the loop (core/loop_share.py): answering a flood
    costs the flooder, not the others."""
    dialect = dialect_for(client)
    try:
        if connection_closed(client):
            raise ReplyNotSent("the satellite is no longer connected")
        if dialect is None:
            raise ReplyNotSent(f"unknown connection type {type(client).__name__}")
        started = time.thread_time()
        dialect.send(client, reply)
        compat.charge_loop_time(client, time.thread_time() - started)   # its share's debt
    except ReplyNotSent as e:
        line = f"not sending {shown(reply.msg_type, quote=False)} to {shown_name(peer)}: {e}"
        if not_sent is None:
            _warn_not_sent(peer, line)
        else:
            not_sent(line)
    except Exception as e:
        LOG.warning(f"could not send {shown(reply.msg_type, quote=False)} to {shown_name(peer)}: "
                    f"{type(e).__name__}: {shown(str(e), 200, quote=False)}")
