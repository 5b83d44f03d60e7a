"""The Redis store's own connections on one Redis, or on the primary Sentinel names (a cluster's
nodes keep redis-py's pools: hub/redis_rounds.py): a few connected ones kept here, outside
redis-py's pool, each lent out for one round trip at a time.

Two kinds of round trip borrow them:
- the early begin: the IO loop writes a turn's begin as the turn goes to a free worker, and the
  worker reads the replies, so that Redis answers while the turn is handed over
  (hub/redis_store.RedisStore.send_begin; bench_store.py measured it). The IO loop must never
  wait, so it writes only on a connection that is already connected and surely fit (below);
  with none at hand the worker begins as usual. It uses those the workers' round trips
  connected and gave back.
- every other round trip of the store's (a turn's begin on its worker, its end, a script): on a
  worker, which takes a kept connection that is fit, or makes and connects one.

Why not redis-py's pool: its `get_connection` and `release` cost about as much of the hub's CPU
as the round trip's own system calls (redis-py 7.4: a read of the socket that raises to say
"nothing", connection-count observations, an event per release; 14 of 41 us for a PING here),
and the hub makes two round trips a turn: bench_store.py --store sentinel measured a turn
1-2 % faster this way (docs/performance.md). The connections are redis-py's own, made from the
pool's class and settings: TLS, the password, the database, and under Sentinel the primary
asked of the sentinels as each connects.

Fit to write to: connected, and nothing to read (a closed socket reads as EOF: Redis restarted,
an idle timeout). The IO loop also refuses one idle longer than the pool's health check allows;
a worker's write PINGs such a one first (redis-py's `check_health`, as its pool does). A round
trip that fails drops every kept connection: the others are as likely to lead to a Redis that
went away or stopped being the primary, and the next round trip connects afresh.
"""
import select
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import redis
from ovos_utils.log import LOG

from hivemind_chat_agent.hub.redis_rounds import STORE_ERRORS

_pack_command: Optional[Callable[[tuple], bytes]]
try:      # the [redis] extra's C packer, called directly on the IO loop (see `_packed`)
    from hiredis import pack_command as _pack_command
except ImportError:     # redis-py without hiredis: its own packer
    _pack_command = None

KEPT_CONNECTIONS = 32    # connections kept idle at most: above the hub's workers and the IO
                         # loop's own round trips at once (beyond it each would connect and
                         # close again: TCP, TLS, AUTH, under Sentinel the sentinels asked)
IDLE_AT_MOST = 30.0      # seconds a kept connection may idle and still be written to (the
                         # store's redis-py health_check_interval)


@dataclass
class SentRound:
    """Commands written by `KeptConnections.send`, their replies not read yet. `started`: when
    the round trip began, on the clock of whoever times it (hub/metrics.TimedStore)."""
    connection: Any
    commands: Tuple[tuple, ...]
    started: float = 0.0


class KeptConnections:
    """The kept connections of one store (`pool`: redis-py's ConnectionPool, or its Sentinel
    pool, whose connections find the primary as they connect: its class and settings make
    them)."""

    def __init__(self, pool: Any, clock: Callable[[], float] = time.monotonic):
        self._pool = pool
        self._clock = clock
        self._idle: List[Tuple[Any, float]] = []   # (connection, kept since), last kept last
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
            if self._clock() - since > IDLE_AT_MOST or not self._fit(connection):
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
        """Worker: the replies of `sent`'s commands, in order; raises what redis-py raised,
        as `round_trip` does (the caller makes it a ConversationStoreError)."""
        return self._replies(sent.connection, sent.commands)

    def round_trip(self, commands: Tuple[tuple, ...]) -> List[Any]:
        """Worker: `commands` written on a connection of its own and their replies read, in
        order; raises what redis-py raised: a reply that is an error (ResponseError) ends the
        round trip there, its connection kept only when no reply is left unread; any other
        failure drops every kept connection."""
        connection = self._borrow()
        try:
            connection.send_packed_command(_packed(connection, commands))
        except BaseException:
            self._failed(connection)
            raise
        return self._replies(connection, commands)

    def _borrow(self) -> Any:
        """A kept connection that is fit, else one made and connected here."""
        while True:
            with self._lock:
                connection = self._idle.pop()[0] if self._idle else None
            if connection is None:
                return self._connected()
            if self._fit(connection):
                return connection
            self._drop(connection)

    def _fit(self, connection: Any) -> bool:
        """Open and quiet, and still one the pool would keep: under Sentinel, connected to the
        primary the sentinels named last (redis-py's pool drops the others as the primary
        changes; a kept one to a primary cut off from the sentinels would write where a
        failover loses it)."""
        return self._pool.owns_connection(connection) and _open_and_quiet(connection)

    def _replies(self, connection: Any, commands: Tuple[tuple, ...]) -> List[Any]:
        replies = []
        try:
            for _ in commands:
                replies.append(connection.read_response())
        except redis.exceptions.ReadOnlyError:   # a replica now (under Sentinel a
            self._failed(connection)               # ConnectionError already): connect afresh
            raise
        except redis.exceptions.ResponseError:
            if len(replies) + 1 < len(commands):  # replies left unread: not reusable
                self._drop(connection)
            else:
                self._keep(connection)
            raise
        except BaseException:
            self._failed(connection)
            raise
        self._keep(connection)
        return replies

    def _failed(self, connection: Any) -> None:
        self._drop(connection)
        self._drop_all()

    def _connected(self) -> Any:
        """A new connection, connected; raises what redis-py raised, nothing left open."""
        connection = self._pool.connection_class(**self._pool.connection_kwargs)
        try:
            connection.connect()
        except BaseException:
            self._drop(connection)
            raise
        return connection

    def close(self) -> None:
        """The kept connections closed, and those lent out as they come back (the store
        closes)."""
        with self._lock:
            self._closed = True
        self._drop_all()

    def _keep(self, connection: Any) -> None:
        with self._lock:
            keep = not self._closed and len(self._idle) < KEPT_CONNECTIONS
            if keep:
                self._idle.append((connection, self._clock()))
        if not keep:
            self._drop(connection)

    @staticmethod
    def _drop(connection: Any) -> None:
        connection.disconnect()

    def _drop_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
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
    bytes: tests/test_redis_connections.py); through hiredis's packer directly where it is
    installed, two thirds of the time on the IO loop."""
    if _pack_command is None:
        return connection.pack_commands(commands)
    return [b"".join([_pack_command(command) for command in commands])]
