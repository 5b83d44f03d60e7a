"""The client's hub connections in the order they were opened, seen from the outside: which
connection a session got (a spare opened before it, or a new one) is observable behaviour
(the hub counts the sockets), so a test asserts on it without reading the pool's fields."""
from hivemind_chat_agent.client.connection import HubConnection


def record_connections(monkeypatch) -> list:
    """A list that every HubConnection whose connect() starts from now on is appended to
    (connect itself runs unchanged); undone with the test's monkeypatch."""
    opened = []
    connect = HubConnection.connect

    def recording(conn, *args, **kwargs):
        opened.append(conn)
        return connect(conn, *args, **kwargs)
    monkeypatch.setattr(HubConnection, "connect", recording)
    return opened
