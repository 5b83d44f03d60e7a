"""What the hub plugin notes on a satellite's connection object (hivemind-core's own, 4.x or
5.x): a token that, unlike the peer name core files it under, never changes (a HELLO renames a
connection), whose client it is for fairness, and whether core has reported it gone. Replies
are addressed to the object, so a rename never loses them and a closed one gets nothing."""
import inspect
import uuid

_TOKEN = "_hivemind_chat_connection"
_CLOSED = "_hivemind_chat_closed"


def mark_closed(client) -> None:
    """hivemind-core reported this connection gone: nothing more is written to it."""
    setattr(client, _CLOSED, True)


def close_connection(clients, client) -> None:
    """IO loop, as hivemind-core reports `client` gone (both modes): nothing more is written to
    it, and its old names in core's table `clients` go with it. hivemind-core 4.0 files a
    connection under a new peer string at every HELLO and forgets only the last one, so each
    session id a connection ever declared would keep the whole connection alive (5.x drops
    the old name at each HELLO itself: there this finds nothing)."""
    for peer in [p for p, c in list(clients.items()) if c is client and p != client.peer]:
        clients.pop(peer, None)
    mark_closed(client)   # replies still on their way to it are not sent


def connection_closed(client) -> bool:
    """Has hivemind-core reported this connection gone (its on_disconnect callback)?"""
    return bool(getattr(client, _CLOSED, False))


def connection_client(client) -> str:
    """Whose turn this is, for fairness: the access key's registered client (every
    connection and session of one key shares its bounds)."""
    return str(getattr(client, "key", None) or connection_token(client))


def connection_token(client) -> str:
    """A name for this connection that, unlike its peer string, never changes."""
    token = getattr(client, _TOKEN, None)
    if token is None:
        token = uuid.uuid4().hex
        setattr(client, _TOKEN, token)
    return token


def hang_up(client, code: int = 1001, reason: str = "") -> None:
    """IO loop: close `client`'s connection, with a close code where the transport takes one
    (5.x: `disconnect(code, reason)`; 4.0's websocket: `disconnect()`). A connection already
    reported gone is left alone."""
    if connection_closed(client):
        return
    disconnect = getattr(client, "disconnect", None)
    if not callable(disconnect):
        return
    try:
        inspect.signature(disconnect).bind(code, reason)
    except TypeError:
        disconnect()
        return
    except ValueError:     # no signature to read (a builtin): try the coded call
        pass
    disconnect(code, reason)
