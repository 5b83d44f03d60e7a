"""The OVOS messagebus connection's socket: every frame acknowledged the moment it is read.

Why (issue 31, measured in docs/performance.md): ovos-messagebus (tornado) writes with Nagle's
algorithm on. tornado turns TCP_NODELAY on for the HTTP upgrade's response and off again once
it is written (`http1connection._finish_request`), and the bus echoes every message to every
client, its sender included. A client that sends an utterance right after it received anything
is, for Linux, in "pingpong" (interactive) mode: it delays the ACK of what it receives next,
the echo of its own utterance, to the delayed-ACK timer (40 ms at least). The bus's next small
frame to it (the skill's `speak`, then `ovos.utterance.handled`) waits behind that unacknowledged
echo until the timer fires: 40 ms on a turn whose bus round trip is 1-2 ms.

TCP_QUICKACK leaves pingpong mode and sends a pending ACK at once, but it is not sticky: the
kernel enters pingpong again at the next send that follows a receive. So the socket sets it
again after every send and every receive (one setsockopt each, about a microsecond), and the
bus never holds an answer for us. We cannot patch ovos-messagebus on users' machines; this is
the client side of the connection, which is ours.

What it cannot remove: the same stall on the *answering* client's connection (ovos-core's own
bus client, which delays the ACK of the echoes of its own `speak`/`handled`): an utterance sent
within that client's delayed-ACK window after its previous answer (about 40 ms) waits for its
timer. Only that client's socket, or the bus's TCP_NODELAY, removes it.
"""
import contextlib
import socket

_QUICKACK: int = getattr(socket, "TCP_QUICKACK", 0)      # Linux only; 0: not here


class _QuickAckSocket(socket.socket):
    """A TCP socket that turns TCP_QUICKACK on again after each send and receive."""

    __slots__ = ()

    def _quick(self) -> None:
        # the data already read or sent must reach the caller: a socket closed meanwhile
        # (EBADF) is the caller's next read's news, not this option's
        with contextlib.suppress(OSError):
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)

    def recv(self, *args):
        data = super().recv(*args)
        self._quick()
        return data

    def recv_into(self, *args):
        count = super().recv_into(*args)
        self._quick()
        return count

    def send(self, *args):
        count = super().send(*args)
        self._quick()
        return count

    def sendall(self, *args):
        result = super().sendall(*args)
        self._quick()
        return result


def keep_acks_quick(ws) -> bool:
    """Makes the websocket-client connection `ws` acknowledge every frame as soon as it is read,
    so that ovos-messagebus never holds a reply behind the ACK of its echo (module docstring).

    `ws` is a connected `websocket.WebSocket`: what `websocket.create_connection(url)` returns,
    or `WebSocketApp.sock` inside the app's `on_open` (ovos-bus-client's `MessageBusClient`):

        class QuickBus(MessageBusClient):
            def on_open(self, *args):
                keep_acks_quick(self.client.sock)   # before connected_event lets emit() in
                super().on_open(*args)

    Its socket is replaced by one on the same descriptor (same connection, options and timeout)
    whose sends and receives set TCP_QUICKACK again; TCP_NODELAY is set too (websocket-client's
    default, but not on a socket it was handed ready-made). Call it before any other thread
    uses the connection, and again after each reconnect (a new socket; `on_open` runs again).
    Idempotent. Returns True when applied; False, leaving `ws` untouched, where it cannot be:
    no socket yet, not a plain TCP socket (a wss:// bus's TLS socket, a Unix socket), or no
    TCP_QUICKACK on this platform (not Linux).
    """
    sock = getattr(ws, "sock", None)
    if isinstance(sock, _QuickAckSocket):
        return True
    if (not _QUICKACK or type(sock) is not socket.socket
            or sock.family not in (socket.AF_INET, socket.AF_INET6)
            or sock.type != socket.SOCK_STREAM):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    quick = _QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.fileno())
    quick.settimeout(sock.gettimeout())
    sock.detach()                          # the descriptor is the new object's to close now
    quick._quick()
    ws.sock = quick
    return True
