"""One round trip of the Redis store (hub/redis_store.py): commands packed on one pooled
connection, on one Redis or on the cluster node serving their slot, optionally followed by
`WAIT` for a replica (durable mode); and the store's errors, typed and without a password.

Why not redis-py's pipeline objects: they cost this hub twice the CPU per turn
(benchmarks/bench_store.py; the begin and the end of every turn come here). Why not a cluster
pipeline: `WAIT` counts the writes of the connection it is sent on, so it must follow the
writes on their own connection, which only this path controls; and all of a call's keys share
a hash tag (hub/redis_keys.py), so one node answers all of them.

On a cluster a MOVED reply (the slot went to another node: a failover, a resharding) refreshes
the slot map and the commands are sent once more, where they now belong: a MOVED command was
not run, and all of a round trip's commands are of one slot, so none of them was. A node that
does not answer also refreshes the map (the next turn finds the promoted replica) and fails the
call, like a single Redis that does not answer.

Early sends (`send_early`, `read`): the IO loop writes a round trip's commands and a worker reads
their replies, so that Redis answers while the turn is handed to the worker. They use
connections of their own, not the pool's, lent out one per round trip: made and connected on a
worker after a turn's last round trip (never on the IO loop, which must not wait), and kept
after each read whose replies all came.
"""
import select
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple, Type

import redis
from ovos_utils.log import LOG

from hivemind_chat_agent.errors import ConversationStoreError

_pack_command: Optional[Callable[[tuple], bytes]]
try:      # the [redis] extra's C packer, called directly on the IO loop (see `_packed`)
    from hiredis import pack_command as _pack_command
except ImportError:     # redis-py without hiredis: its own packer
    _pack_command = None

# what redis-py raises when the store does not answer or refuses: RedisClusterException is not
# a RedisError (a cluster without a node that answers, a slot no node serves)
STORE_ERRORS: Tuple[Type[Exception], ...] = (
    redis.RedisError, redis.exceptions.RedisClusterException, OSError)
DURABLE_WAIT_MS = 1000   # a durable write waits this long at most for one replica's ack
EARLY_CONNECTIONS = 8    # connections kept for early sends (turns beginning at once beyond
                         # this many begin on their worker, as without early sends)


@dataclass
class SentRound:
    """Commands written by `RoundTrips.send_early`, their replies not read yet. `started`: when
    the round trip began, on the clock of whoever times it (hub/metrics.TimedStore)."""
    connection: Any
    commands: Tuple[tuple, ...]
    started: float = 0.0


class RoundTrips:
    """`run` and `script` for one client (redis.Redis, or a RedisCluster when `cluster`);
    `where` is the store's URL without its password, for error messages."""

    def __init__(self, client: Any, cluster: bool, where: str):
        self.redis = client
        self.cluster = cluster
        self.where = where
        self._early: List[Any] = []    # connected, no reply pending, ready for `send_early`
        self._early_owned = 0          # those plus the ones lent to a round trip
        self._early_lock = threading.Lock()
        self._early_closed = False     # the store closed: nothing kept any more

    def run(self, *commands: tuple, durable: bool = False) -> List[Any]:
        """`commands` in one round trip, their replies in order. `durable`: then `WAIT 1` on
        the same connection, and ConversationStoreError unless a replica acknowledged them
        within DURABLE_WAIT_MS (they are written on the primary, but not known to survive
        its failover)."""
        if durable:
            commands += (("WAIT", 1, DURABLE_WAIT_MS),)
        try:
            replies = self._send(commands)
        except redis.exceptions.MovedError:
            self._refresh()
            try:
                replies = self._send(commands)
            except redis.exceptions.MovedError as e:
                raise self.error(e) from None
        if durable:
            if replies[-1] < 1:
                raise ConversationStoreError(
                    f"the conversation store at {self.where} did not get a replica's "
                    f"acknowledgement within {DURABLE_WAIT_MS} ms (store_durable): the "
                    "write is on the primary only, and a failover could lose it")
            replies = replies[:-1]
        return replies

    def _send(self, commands: Tuple[tuple, ...]) -> List[Any]:
        """A connection that failed is dropped, never handed back with unread replies."""
        try:
            pool = self._pool(commands[0])
            try:
                connection = pool.get_connection()
            except TypeError:      # redis-py before 5.3 wants a command name (any)
                connection = pool.get_connection("GET")
        except STORE_ERRORS as e:
            self._refresh()
            raise self.error(e) from None
        try:
            connection.send_packed_command(connection.pack_commands(commands))
            return [connection.read_response() for _ in commands]
        except (redis.exceptions.NoScriptError, redis.exceptions.MovedError):
            if len(commands) > 1:      # replies left unread: the connection is not reusable
                connection.disconnect()
            raise
        except STORE_ERRORS as e:
            connection.disconnect()
            self._refresh()
            raise self.error(e) from None
        finally:
            pool.release(connection)

    def send_early(self, *commands: tuple) -> Optional[SentRound]:
        """IO loop: `commands` written now, their replies left for `read` (a worker's); None
        when that would wait: no early connection at hand (on a cluster, never: a MOVED reply
        is answered by sending again), or the one at hand is closed or has data (Redis went
        away meanwhile: it is dropped, and the worker's round trip connects anew)."""
        if self.cluster:
            return None
        with self._early_lock:
            connection = self._early.pop() if self._early else None
        if connection is None:
            return None
        try:
            if not _open_and_quiet(connection):
                raise redis.ConnectionError("the connection closed while idle")
            connection.send_packed_command(_packed(connection, commands), check_health=False)
        except Exception as e:   # whatever it was, the worker's own round trip follows
            self._drop_early(connection)
            if not isinstance(e, STORE_ERRORS):
                LOG.warning(f"an early store round trip failed ({type(e).__name__}); the "
                            "turn begins on its worker")
            return None
        return SentRound(connection, commands)

    def read(self, sent: SentRound) -> List[Any]:
        """Worker: the replies of `sent`'s commands, in order; a failure as `run`'s."""
        try:
            replies = [sent.connection.read_response() for _ in sent.commands]
        except STORE_ERRORS as e:
            self._drop_early(sent.connection)
            raise self.error(e) from None
        with self._early_lock:
            keep = not self._early_closed
            if keep:
                self._early.append(sent.connection)
        if not keep:
            self._drop_early(sent.connection)
        return replies

    def stock_early(self) -> None:
        """Worker, after a turn's last round trip: one more connection for early sends, made
        and connected here (not one of the pool's: the next round trip would have to connect
        one), while fewer than EARLY_CONNECTIONS are kept and none is at hand. A store that
        does not answer leaves the stock as it is: the next round trip reports it."""
        with self._early_lock:
            if self.cluster or self._early_closed or self._early or \
                    self._early_owned >= EARLY_CONNECTIONS:
                return
            self._early_owned += 1
        connection = self.redis.connection_pool.make_connection()
        try:
            connection.connect()
        except STORE_ERRORS:
            connection.disconnect()
            with self._early_lock:
                self._early_owned -= 1
            return
        with self._early_lock:
            self._early.append(connection)

    def _drop_early(self, connection: Any) -> None:
        """A connection in an unknown state (replies unread, closed): closed and forgotten
        (the next turn's last round trip makes another)."""
        connection.disconnect()
        with self._early_lock:
            self._early_owned -= 1

    def close_early(self) -> None:
        """The kept connections closed, and those lent out once read (the store closes)."""
        with self._early_lock:
            self._early_closed = True
            kept, self._early = self._early, []
            self._early_owned -= len(kept)
        for connection in kept:
            connection.disconnect()

    def _pool(self, first: tuple) -> Any:
        """The connection pool of the Redis that serves `first`'s key (every command of a
        round trip is of one slot): the one Redis, or the primary of that slot."""
        if not self.cluster:
            return self.redis.connection_pool
        key = first[3] if first[0] == "EVALSHA" else first[1]
        node = self.redis.nodes_manager.get_node_from_slot(self.redis.keyslot(key))
        return self.redis.get_redis_connection(node).connection_pool

    def _refresh(self) -> None:
        """Cluster: read the slot map again (after MOVED, or a node that did not answer)."""
        if self.cluster:
            try:
                self.redis.nodes_manager.initialize()
            except STORE_ERRORS:
                pass      # no node answers: the next call tries again

    def script(self, script: Any, prefix: str, keys: List[str], args: List[Any]) -> Any:
        """One of hub/redis_scripts.py's scripts (a registered redis-py Script), its first
        argument the key prefix of its conversation: EVALSHA on the packed path (redis-py's
        Script objects cost this hub about 0.1 ms more per turn), loaded again when Redis lost
        it (a restart; on a cluster SCRIPT LOAD goes to every primary)."""
        command = ("EVALSHA", script.sha, len(keys), *keys, prefix, *args)
        try:
            return self.run(command)[0]
        except redis.exceptions.NoScriptError:
            self.call("script_load", script.script)
            return self.run(command)[0]

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The client's redis-py `method`, its failure a ConversationStoreError (a cluster
        client is made at its first use, which may fail too: hub/redis_urls.py)."""
        try:
            return getattr(self.redis, method)(*args, **kwargs)
        except STORE_ERRORS as e:
            raise self.error(e) from None

    def error(self, e: Exception) -> ConversationStoreError:
        return ConversationStoreError(
            f"the conversation store at {self.where} failed ({type(e).__name__}: "
            f"{str(e)[:200]}); turns fail until it answers again, then the hub continues "
            "by itself")


def _open_and_quiet(connection: Any) -> bool:
    """Connected, and nothing to read: a closed socket (Redis restarted, an idle timeout)
    reads as EOF. One poll of the socket (redis-py's `can_read` takes three times as long on
    the IO loop: it reads with a timeout of 0 and catches the error)."""
    sock = getattr(connection, "_sock", None)
    return sock is not None and not select.select([sock], [], [], 0)[0]


def _packed(connection: Any, commands: Tuple[tuple, ...]) -> List[bytes]:
    """`commands` in the protocol's bytes, as `connection.pack_commands` makes them (same
    bytes: tests/test_conversation_store.py); through hiredis's packer directly where it is
    installed, two thirds of the time on the IO loop."""
    if _pack_command is None:
        return connection.pack_commands(commands)
    return [b"".join([_pack_command(command) for command in commands])]
