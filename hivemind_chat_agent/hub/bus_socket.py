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
timer. Only that client's socket, or the bus's TCP_NODELAY, removes it; or, for every
connection on the machine, the route's `quickack` attribute (config/quick-loopback.sh).
`warn_of_delayed_acks` says so in the hub's log when the bus is on this machine and the route to
it lacks that attribute, since nothing else would tell the operator why turns take 40 ms more.
"""
import contextlib
import socket
import subprocess
import threading
from typing import Callable, Set

from ovos_utils.log import LOG

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


def lacks_quickack(route: str) -> bool:
    """Whether `route`, what `ip -o route get ADDRESS` says, is a route to this machine (it
    begins with `local`) without `quickack 1`. A route elsewhere is False: the ACKs that
    matter are then another machine's."""
    words = route.split()
    if not words or words[0] != "local":
        return False
    return not any(words[i] == "quickack" and words[i + 1] == "1" for i in range(len(words) - 1))


def route_to(address: str, run: Callable[..., "subprocess.CompletedProcess[str]"] =
             subprocess.run) -> str:
    """`ip -o route get ADDRESS`'s answer; "" where `ip` is missing, fails or is slow."""
    try:
        done = run(["ip", "-o", "route", "get", address], capture_output=True, text=True,
                   errors="replace", timeout=2)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


_ASKED: Set[str] = set()       # addresses whose route this process has looked at
_ASKED_LOCK = threading.Lock()


def warn_of_delayed_acks(sock: socket.socket, route: Callable[[str], str] = route_to) -> None:
    """Look, once per address in a process and on a thread of its own (never on the bus
    connection's path: `ip` may be slow on a busy machine), at the route to the bus `sock` is
    connected to; `check_route` says what it finds. It is advice: nothing it meets can fail the
    connection."""
    try:
        address = str(sock.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return
    with _ASKED_LOCK:
        if address in _ASKED:
            return
        _ASKED.add(address)
    try:
        threading.Thread(target=check_route, args=(address, route), daemon=True,
                         name="hivemind-chat-route-check").start()
    except RuntimeError:         # no thread to be had: no advice either
        pass


def check_route(address: str, route: Callable[[str], str] = route_to) -> bool:
    """Log a warning when the route to `address` (the hub's own connection to the bus) is this
    machine's and has no `quickack` (module docstring); True if warned. ovos-core, whose ACKs
    the warning is about, reaches a bus on this machine through the same loopback route when
    both use 127.0.0.1 (ovos-core's default); on another local address the hub's route is the
    one looked at."""
    try:
        if not lacks_quickack(route(address)):
            return False
    except Exception as e:       # advice only: never let it reach a caller
        LOG.debug(f"the route to {address} not checked: {type(e).__name__}: {e}")
        return False
    loopback = address.startswith("127.")
    fix = ("as root, at each boot: ip route replace local 127.0.0.1 dev lo table local proto "
           "kernel scope host src 127.0.0.1 quickack 1, and the same for 127.0.0.0/8 "
           "(config/quick-loopback.sh of the source does both)" if loopback else
           f"add quickack 1 to the local route of {address} (ip route replace ...)")
    LOG.warning(f"the OVOS messagebus at {address} is on this machine and the route to it has "
                "no quickack: ovos-core's delayed ACKs can hold a turn up to 40 ms "
                f"(docs/troubleshooting.md). To remove them, {fix}")
    return True
