"""How a reply reaches a satellite: one link per hivemind-core generation, chosen per connection.

hivemind-core 4.x connections carry the password handshake's session key and leave encryption to
whoever writes (`link_v4`); 5.x connections carry a Noise transport and encrypt in their own
`send` (`link_v5`). Everything generation-specific about answering a satellite lives in those
two modules, behind the same four names:

    fits(client) -> bool            is this connection object of that generation?
    authenticated(client) -> bool   was the message being handled proven to come from the key's
                                    holder (not merely someone who knows the access key)?
    declared_session_id(client, sid)  the session id the satellite itself declared, from the
                                    one core handed the agent (5.x namespaces it)
    send(client, reply: Message)    encrypt and write one BUS reply, or raise ReplyNotSent
    install()                       process-wide hooks, idempotent

The link is picked once per connection, from what the object has, and kept on it.
"""
from types import ModuleType
from typing import Optional

_LINK_ATTR = "_hivemind_chat_link"


def _links():
    from hivemind_chat_agent.hub import link_v4, link_v5
    return (link_v5, link_v4)     # a 4.x pre-release with a Noise session counts as 5.x


def install_links() -> None:
    for link in _links():
        link.install()


def link_for(client) -> Optional[ModuleType]:
    """The link module for this connection, or None for a connection object of no known
    generation (the caller refuses it, with a warning)."""
    link = getattr(client, _LINK_ATTR, None)
    if link is None:
        link = next((candidate for candidate in _links() if candidate.fits(client)), None)
        if link is not None:
            try:
                setattr(client, _LINK_ATTR, link)
            except AttributeError:    # a slotted object: choose again next time
                pass
    return link
