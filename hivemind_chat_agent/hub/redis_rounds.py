"""One round trip of the Redis store (hub/redis_store.py): commands packed on one connection, of
the store's own on one Redis (hub/redis_connections.py) or of redis-py's pool of the cluster
node serving their slot, optionally followed by `WAIT` for a replica (durable mode); and the
store's errors, typed and without a password.

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
"""
from typing import TYPE_CHECKING, Any, List, Optional, Tuple, Type

import redis

from hivemind_chat_agent.errors import ConversationStoreError

if TYPE_CHECKING:
    from hivemind_chat_agent.hub.redis_connections import KeptConnections

# what redis-py raises when the store does not answer or refuses: RedisClusterException is not
# a RedisError (a cluster without a node that answers, a slot no node serves)
STORE_ERRORS: Tuple[Type[Exception], ...] = (
    redis.RedisError, redis.exceptions.RedisClusterException, OSError)
DURABLE_WAIT_MS = 1000   # a durable write waits this long at most for one replica's ack


class RoundTrips:
    """`run` and `script` for one client: on `kept`'s connections (redis.Redis: one Redis,
    Sentinel), or, without them, a RedisCluster's, each round trip on the pool of the node
    serving its slot; `where` is the store's URL without its password, for error messages."""

    def __init__(self, client: Any, where: str, kept: Optional["KeptConnections"] = None):
        self.redis = client
        self.where = where
        self._kept = kept

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
        """A connection that failed is dropped, never handed back with unread replies (the
        kept connections: hub/redis_connections.py; a cluster node's pool: here)."""
        if self._kept is not None:
            try:
                return self._kept.round_trip(commands)
            except redis.exceptions.NoScriptError:
                raise
            except STORE_ERRORS as e:
                raise self.error(e) from None
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

    def _pool(self, first: tuple) -> Any:
        """The connection pool of the primary serving `first`'s slot (every command of a
        round trip is of one slot)."""
        key = first[3] if first[0] == "EVALSHA" else first[1]
        node = self.redis.nodes_manager.get_node_from_slot(self.redis.keyslot(key))
        return self.redis.get_redis_connection(node).connection_pool

    def _refresh(self) -> None:
        """Cluster: read the slot map again (after MOVED, or a node that did not answer; the
        kept connections' path raises neither here)."""
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
