"""Early round trips of the Redis store: the IO loop writes a round trip's commands and a worker
reads their replies, so that Redis answers while a turn is handed to its worker
(hub/redis_store.RedisStore.send_begin; bench_store.py measured it).

The IO loop must never wait, so it only ever writes on a connection that is already connected:
one of a few kept here, outside redis-py's pool (they never count against its
`max_connections`), made and connected by a worker after a turn's job (`stock`), lent out for
one round trip and kept again once all its replies were read. A connection that may be stale is
never written to: closed or with data to read (Redis restarted, an idle timeout), or idle longer
than the pool's health check would allow (redis-py PINGs such a one first; here the worker's
own round trip does). A read that fails drops every kept connection: the others are as likely
to lead to a Redis that went away or stopped being the primary. Not on a cluster, where a MOVED
reply is answered by sending again (hub/redis_rounds.py).
"""
import select
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from ovos_utils.log import LOG

from hivemind_chat_agent.hub.redis_rounds import STORE_ERRORS

_pack_command: Optional[Callable[[tuple], bytes]]
try:      # the [redis] extra's C packer, called directly on the IO loop (see `_packed`)
    from hiredis import pack_command as _pack_command
except ImportError:     # redis-py without hiredis: its own packer
    _pack_command = None

EARLY_CONNECTIONS = 8    # connections kept (turns beginning at once beyond this many begin on
                         # their worker, as without early round trips)
IDLE_AT_MOST = 30.0      # seconds a kept connection may idle and still be written to (the
                         # store's redis-py health_check_interval)


@dataclass
class SentRound:
    """Commands written by `EarlyConnections.send`, their replies not read yet. `started`: when
    the round trip began, on the clock of whoever times it (hub/metrics.TimedStore)."""
    connection: Any
    commands: Tuple[tuple, ...]
    started: float = 0.0


class EarlyConnections:
    """The kept connections of one store's pool (`pool`: redis-py's ConnectionPool, or its
    Sentinel pool, whose connections find the primary as they connect)."""

    def __init__(self, pool: Any, clock: Callable[[], float] = time.monotonic):
        self._pool = pool
        self._clock = clock
        self._idle: List[Tuple[Any, float]] = []   # (connection, kept since), last kept last
        self._owned = 0                             # those plus the ones lent out
        self._lock = threading.Lock()
        self._closed = False

    def send(self, commands: Tuple[tuple, ...]) -> Optional[SentRound]:
        """IO loop: `commands` written now on a kept connection; None when none is at hand
        that is surely fit (the worker's own round trip follows then)."""
        with self._lock:
            connection, since = self._idle.pop() if self._idle else (None, 0.0)
        if connection is None:
            return None
        try:
            if self._clock() - since > IDLE_AT_MOST or not _open_and_quiet(connection):
                raise ConnectionError("the connection may be stale")
            connection.send_packed_command(_packed(connection, commands), check_health=False)
        except Exception as e:   # whatever it was, the worker's own round trip follows
            self._drop(connection)
            if not isinstance(e, STORE_ERRORS):
                LOG.warning(f"an early store round trip failed ({type(e).__name__}); the "
                            "turn begins on its worker")
            return None
        return SentRound(connection, commands)

    def read(self, sent: SentRound) -> List[Any]:
        """Worker: the replies of `sent`'s commands, in order; raises what redis-py raised
        (the caller makes it a ConversationStoreError), every kept connection dropped."""
        try:
            replies = [sent.connection.read_response() for _ in sent.commands]
        except STORE_ERRORS:
            self._drop(sent.connection)
            self._drop_all()
            raise
        self._keep(sent.connection)
        return replies

    def stock(self) -> None:
        """Worker: one more connection, made and connected here, when none is at hand and
        fewer than EARLY_CONNECTIONS are kept. A store that does not answer leaves the stock
        as it is: the next turn's own round trip reports it."""
        with self._lock:
            if self._closed or self._idle or self._owned >= EARLY_CONNECTIONS:
                return
            self._owned += 1
        connection = None
        try:
            connection = self._pool.connection_class(**self._pool.connection_kwargs)
            connection.connect()
        except STORE_ERRORS:
            if connection is not None:
                connection.disconnect()
            with self._lock:
                self._owned -= 1
            return
        self._keep(connection)

    def close(self) -> None:
        """The kept connections closed, and those lent out as they come back (the store
        closes)."""
        with self._lock:
            self._closed = True
        self._drop_all()

    def _keep(self, connection: Any) -> None:
        with self._lock:
            keep = not self._closed
            if keep:
                self._idle.append((connection, self._clock()))
        if not keep:
            self._drop(connection)

    def _drop(self, connection: Any) -> None:
        connection.disconnect()
        with self._lock:
            self._owned -= 1

    def _drop_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._owned -= len(idle)
        for connection, _since in idle:
            connection.disconnect()


def _open_and_quiet(connection: Any) -> bool:
    """Connected, and nothing to read: a closed socket (Redis restarted, an idle timeout)
    reads as EOF. One poll of the socket (redis-py's `can_read` takes three times as long on
    the IO loop: it reads with a timeout of 0 and catches the error); poll, not select, which
    refuses descriptors past 1023 (a hub with a thousand satellites has them)."""
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)


def _packed(connection: Any, commands: Tuple[tuple, ...]) -> List[bytes]:
    """`commands` in the protocol's bytes, as `connection.pack_commands` makes them (same
    bytes: tests/test_conversation_store.py); through hiredis's packer directly where it is
    installed, two thirds of the time on the IO loop."""
    if _pack_command is None:
        return connection.pack_commands(commands)
    return [b"".join([_pack_command(command) for command in commands])]
