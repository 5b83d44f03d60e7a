"""hub/redis_connections.KeptConnections, the Redis store's own connections, and the store's
round trips through them (hub/redis_rounds.RoundTrips, as RedisStore makes it), on a real
redis-server where a test needs one: replies never go to the wrong round trip, a connection
that may be stale is never written to, a failure leaves none behind that could be."""
import os
import signal
import socket
import threading
import time

import pytest
import redis

from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub import redis_connections
from hivemind_chat_agent.hub.redis_rounds import RoundTrips
from hivemind_chat_agent.hub.redis_store import _Script


class Store:
    """RoundTrips on kept connections, made as RedisStore makes them; `probe` a client of its
    own for looking at the server."""

    def __init__(self, server, socket_timeout=5.0):
        self.client = redis.Redis.from_url(server.url, decode_responses=True,
                                           socket_timeout=socket_timeout,
                                           health_check_interval=30)
        self.kept = redis_connections.KeptConnections(self.client.connection_pool)
        self.rounds = RoundTrips(self.client, server.url, self.kept)
        self.probe = redis.Redis(port=server.port, decode_responses=True)

    def connected(self) -> int:
        """Clients connected to the server, the probe's own not counted."""
        return int(self.probe.info("clients")["connected_clients"]) - 1

    def close(self):
        self.kept.close()
        self.client.close()
        self.probe.close()


@pytest.fixture
def store(redis_server):
    made = Store(redis_server)
    yield made
    made.close()


def test_round_trips_at_once_each_get_their_own_replies_on_at_most_the_kept_connections(store):
    """Sixteen threads, each its own counter, 40 round trips each: every reply is its own
    round trip's, redis-py's pool makes no connection, and afterwards no more than
    KEPT_CONNECTIONS are open, all of them kept."""
    errors = []

    def count(n):
        try:
            for i in range(1, 41):
                assert store.rounds.run(("INCR", f"n{n}"), ("GET", f"n{n}")) == [i, str(i)]
        except Exception as e:     # reported by the test
            errors.append(e)
    threads = [threading.Thread(target=count, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:3]
    assert store.client.connection_pool._created_connections == 0
    assert 1 <= len(store.kept._idle) <= redis_connections.KEPT_CONNECTIONS
    assert store.connected() == len(store.kept._idle)
    for _ in range(20):                                     # one at a time: the same one
        store.rounds.run(("PING",))
    assert store.connected() == len(store.kept._idle)


def test_an_error_reply_ends_its_round_trip_and_leaves_no_reply_unread(store):
    """WRONGTYPE in the middle of a round trip: ConversationStoreError, and that connection
    is not kept with the rest of the replies unread (the next round trip would read them as
    its own); as the last reply it is, nothing being unread."""
    with pytest.raises(ConversationStoreError, match="WRONGTYPE"):
        store.rounds.run(("SET", "k", "v"), ("LPUSH", "k", "x"), ("GET", "k"))
    assert store.kept._idle == []
    assert store.rounds.run(("GET", "k")) == ["v"]
    with pytest.raises(ConversationStoreError, match="WRONGTYPE"):
        store.rounds.run(("GET", "k"), ("LPUSH", "k", "x"))
    assert len(store.kept._idle) == 1
    assert store.rounds.run(("GET", "k"), ("PING",)) == ["v", "PONG"]


def test_a_script_redis_lost_is_loaded_again_on_the_same_connection(store):
    """EVALSHA of a script Redis no longer has (a restart, SCRIPT FLUSH): NOSCRIPT, loaded,
    run; the connection stays kept (its one reply was read)."""
    script = _Script("return ARGV[1] .. ARGV[2]")
    assert store.rounds.script(script, "p:", ["k"], ["x"]) == "p:x"
    kept = store.kept._idle[0][0]
    store.probe.script_flush()
    assert store.rounds.script(script, "p:", ["k"], ["y"]) == "p:y"
    assert [connection for connection, _ in store.kept._idle] == [kept]


def test_a_connection_redis_closed_is_never_written_to(store):
    """Redis closed every kept connection (CLIENT KILL: as an idle timeout or a restart does):
    the next round trip finds each one closed, drops it, and runs on a new one."""
    connections = [store.kept._borrow() for _ in range(3)]
    for connection in connections:
        store.kept._keep(connection)
    assert store.connected() == 3
    store.probe.client_kill_filter(_type="normal", skipme=True)
    assert store.rounds.run(("SET", "k", "v"), ("GET", "k")) == ["OK", "v"]
    assert len(store.kept._idle) == 1 and store.connected() == 1
    assert store.kept._idle[0][0] not in connections


def test_a_connection_the_pool_would_no_longer_keep_is_never_written_to(store, monkeypatch):
    """Under Sentinel redis-py's pool keeps only connections to the primary the sentinels named
    last (owns_connection); a kept connection it would not keep (a primary cut off from the
    sentinels, still reachable from the hub) is dropped, on the worker's and the IO loop's
    path alike."""
    store.rounds.run(("PING",))
    old = store.kept._idle[0][0]
    pool = store.client.connection_pool
    monkeypatch.setattr(pool, "owns_connection", lambda connection: connection is not old)
    assert store.kept.send((("PING",),)) is None            # the IO loop: not written to
    assert store.rounds.run(("PING",)) == ["PONG"]           # the worker: a new one
    assert [c for c, _ in store.kept._idle] != [old] and old._sock is None


def test_a_redis_that_became_a_replica_is_left_for_a_new_connection(store):
    """READONLY (the Redis behind the URL was demoted): the round trip fails with
    ConversationStoreError and no kept connection is used again; once it is a primary again
    the next round trip works."""
    for connection in [store.kept._borrow() for _ in range(3)]:
        store.kept._keep(connection)
    store.probe.replicaof("127.0.0.1", 1)                     # a primary that never answers
    try:
        with pytest.raises(ConversationStoreError, match="READONLY|replica"):
            store.rounds.run(("SET", "k", "v"))
        assert store.kept._idle == []
    finally:
        store.probe.replicaof("NO", "ONE")
    assert store.rounds.run(("SET", "k", "v")) == ["OK"]


def test_a_round_trip_that_fails_drops_every_kept_connection(redis_server):
    """Redis stops answering (SIGSTOP) during a round trip: it fails within the socket
    timeout with ConversationStoreError, and the other kept connections go too (as likely to
    lead to the same broken Redis); once Redis answers again the next round trip connects
    afresh."""
    store = Store(redis_server, socket_timeout=0.5)
    try:
        connections = [store.kept._borrow() for _ in range(3)]
        for connection in connections:
            store.kept._keep(connection)
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(ConversationStoreError, match="Timeout"):
                store.rounds.run(("PING",))
            assert time.monotonic() - started < 5
            assert store.kept._idle == []
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
        assert store.rounds.run(("PING",)) == ["PONG"]
        assert store.connected() == 1
    finally:
        store.close()


def test_a_connection_idle_past_the_health_check_is_pinged_before_it_is_written_to(store):
    """A worker's round trip on a connection idle longer than the client's health check
    interval PINGs it first, as redis-py's pool does (a connection can die without its socket
    saying so: a firewall, a peer gone silent); one used recently is not."""
    def pings():
        return store.probe.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)
    store.rounds.run(("GET", "k"))
    before = pings()
    store.rounds.run(("GET", "k"))
    assert pings() == before
    store.kept._idle[0][0].next_health_check = 0        # as if idle for 30 s
    store.rounds.run(("GET", "k"))
    assert pings() == before + 1


def test_the_packer_writes_the_bytes_redis_pys_would():
    """Round trips are packed with hiredis's packer directly; the bytes are redis-py's own, for
    every kind of argument a begin carries."""
    commands = (("GET", "hivemind-chat:session:ünïcode-s"),
                ("LRANGE", "hivemind-chat:history:s", 0, -1),
                ("SET", "hivemind-chat:turn:1:s:t", '{"state": "running"}', "NX", "EX", 600),
                ("ZADD", "hivemind-chat:turns:c", time.time(), "s:t"),
                ("ZADD", "hivemind-chat:turns:c", 1e16 + 0.5, "s:t"), ("ZCARD", "x"))
    connection = redis.Connection()
    assert redis_connections._pack_command is not None        # the [redis] extra has hiredis
    assert b"".join(redis_connections._packed(connection, commands)) == \
        b"".join(connection.pack_commands(commands))


def test_an_early_connection_is_written_to_only_when_surely_fit():
    """The IO loop's early write: a kept connection idle past IDLE_AT_MOST, closed by its
    peer, or with data to read is dropped instead of written to; the check is a poll, which
    also works for descriptors past 1023 (select() refuses them)."""
    class Connection:
        def __init__(self, sock):
            self._sock, self.sent, self.closed = sock, [], False

        def send_packed_command(self, packed, check_health=True):
            self.sent.append(b"".join(packed))

        def disconnect(self):
            self.closed = True

    class Pool:          # every connection still one it would keep
        def owns_connection(self, connection):
            return True

    now = [0.0]
    early = redis_connections.KeptConnections(pool=Pool(), clock=lambda: now[0])
    ours, redis_end = socket.socketpair()
    high = os.dup2(ours.fileno(), 1500)               # a hub with a thousand satellites
    sock = socket.socket(fileno=high)
    try:
        kept = Connection(sock)
        early._idle = [(kept, 0.0)]
        sent = early.send((("GET", "k"),))
        assert sent is not None and kept.sent == [b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"]
        early._keep(kept)
        now[0] = redis_connections.IDLE_AT_MOST + 1                 # idle too long: not written
        assert early.send((("GET", "k"),)) is None and kept.closed and not early._idle
        for stale in (b"+stray\r\n", None):                  # data to read, or closed
            fresh = Connection(sock)
            early._idle = [(fresh, now[0])]
            if stale is None:
                redis_end.close()
            else:
                redis_end.sendall(stale)
            assert early.send((("GET", "k"),)) is None and fresh.closed and not fresh.sent
    finally:
        sock.close()
        ours.close()
