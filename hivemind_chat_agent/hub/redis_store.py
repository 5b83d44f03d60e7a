"""The conversation store on Redis (hub/conversation_store.py has the contract), for hubs that
share conversations: replicas behind one address.

Keys (hub/redis_keys.py, with the hash tags that keep each call on one cluster node):
    history:<engine session id>   a list of JSON [user, assistant, ended], oldest first
    session:<engine session id>   the hub-kept OVOS Session, JSON
    secret                        the hub secret, hex, set once by whichever hub comes first
    turn:<n>:<session>:<turn id>  a turn's record: JSON {state, owner, sentences, ended}
    sessions:<client>             the client's sessions, by last turn (max_sessions_per_client)
    turns:<client>                the client's turn records, by last write
                                  (max_turn_records_per_client)
    alive:<hub id>                present while that hub runs (renewed every second, 3 s TTL)
Engine session ids are keyed digests of the access key and the declared id (core/satellites.py)
and <client> is the digest alone: no access key or utterance is in a key name, and every id in
one is bounded (core/limits.py). Every write renews its conversation's keys for `session_ttl`.
A turn costs two round trips of plain commands: one as it begins (the Session and history read,
its record claimed and counted; written by the IO loop as the turn goes to a free worker, which
reads the replies: `send_begin`) and one as it ends, after the answer (the exchange appended and
trimmed, the record done, the session marked the client's most recent); a third when the engine
changed the Session. A client at one of its caps costs one script more (hub/redis_scripts.py),
as a turn ends: a new session past `max_sessions_per_client`, or a client at
`max_turn_records_per_client` (its oldest finished records go, a sixteenth of the cap, so that
the next claims fit); and as a turn begins when many of its turns run at once.

Durable mode (`store_durable`): the writes that keep a turn's outcome (its exchange, its record
done, its Session) are followed by `WAIT 1` on their connection (hub/redis_rounds.py), and a
write no replica acknowledged within DURABLE_WAIT_MS raises ConversationStoreError: Redis
replicates asynchronously, and what only the primary had is lost when a replica is promoted.
"""
import hashlib
import json
import secrets
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

from hivemind_chat_agent.core.transcript import Exchange, clip
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub import redis_scripts
from hivemind_chat_agent.hub.conversation_store import (
    DONE,
    MAX_TURN_RECORDS_PER_CLIENT,
    PING_TIMEOUT,
    REDIS_TIMEOUT,
    RUNNING,
    TURN_RECORD_TTL,
    Begun,
    TurnRecord,
    TurnRecordsFull,
    bounded,
    exchange_to_json,
    exchanges_from_json,
    record_from_json,
    record_to_json,
)
from hivemind_chat_agent.hub.redis_connections import KeptConnections, SentRound
from hivemind_chat_agent.hub.redis_keys import (
    SECRET,
    alive_key,
    history_key,
    member,
    prefixer,
    session_key,
    sessions_key,
    turn_key,
    turns_key,
)
from hivemind_chat_agent.hub.redis_rounds import STORE_ERRORS, RoundTrips
from hivemind_chat_agent.hub.redis_urls import is_cluster, redis_client, shown_url

HEARTBEAT = 1.0        # seconds between this hub's "alive" renewals
ALIVE_FOR = 3          # seconds an "alive" key outlives its last renewal


class RedisStore:
    """The store on one Redis, the primary Sentinel names, or a Redis Cluster (the URL says
    which: hub/redis_urls.py). `durable`: see the module."""
    shared = True    # every replica behind one address reads it

    def __init__(self, url: str, history_turns: int, history_bytes: int, session_ttl: float,
                 max_sessions_per_client: int = 256,
                 max_turn_records_per_client: int = MAX_TURN_RECORDS_PER_CLIENT,
                 durable: bool = False):
        self._where = shown_url(url)
        cluster = self._cluster = is_cluster(url)
        self._redis = redis_client(
            url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT,
            health_check_interval=30, decode_responses=True)
        # the store's own connections, for its round trips and the begin's early ones
        # (`send_begin`): not on a cluster (hub/redis_connections.py)
        self._kept = None if cluster else KeptConnections(self._redis.connection_pool)
        self._rounds = RoundTrips(self._redis, self._where, self._kept)
        self._prefix = prefixer(cluster)
        self.durable = durable
        self.history_turns = history_turns
        self.history_bytes = history_bytes
        self._ttl = max(1, int(session_ttl))
        self.max_sessions_per_client = max_sessions_per_client
        self.max_turn_records_per_client = max_turn_records_per_client
        self._scripts = {name: _Script(getattr(redis_scripts, name))
                         for name in ("MAKE_ROOM", "EVICT_SESSIONS", "TAKE_OVER", "UNCLAIM")}
        self._secret: Optional[bytes] = None
        self.owner = uuid.uuid4().hex          # this hub, as the owner of the turns it runs
        self._running = record_to_json(TurnRecord(RUNNING, self.owner))   # its claims' value
        self._closed = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None
        self._heartbeat_lock = threading.Lock()
        # readiness pings on a client of their own: a short timeout, and never a turn's
        # pooled connection (one connection at most: the health server asks one at a time)
        self._pinger = redis_client(
            url, socket_timeout=PING_TIMEOUT, socket_connect_timeout=PING_TIMEOUT,
            max_connections=1, decode_responses=True)
        self._ping_lock = threading.Lock()

    def history(self, session_id: str) -> List[Exchange]:
        if self.history_turns == 0:
            return []
        raw = self._rounds.call("lrange",
                                history_key(self._prefix(session_id), session_id), 0, -1)
        return exchanges_from_json(raw)

    def record(self, session_id: str, exchange: Exchange) -> None:
        """Appended, then the oldest trimmed to the bounds. Turns of one session come one at a
        time (the satellite waits for each answer), so read-then-trim needs no transaction."""
        if self.history_turns:
            self._rounds.run(*self._append(session_id, exchange, self.history(session_id)),
                             durable=self.durable)

    def begin(self, session_id: str, turn_id: str, client: str = "",
              sent: Optional[SentRound] = None) -> Begun:
        """The Session and history read and the record claimed (and counted, for a client
        with many turns at once), in one round trip; the rest of the bookkeeping waits for
        `finish`, after the answer. `sent`: what `send_begin` wrote for this turn, whose
        replies are read here instead."""
        if sent is not None and self._kept is not None:
            try:
                replies = self._kept.read(sent)
            except STORE_ERRORS as e:
                raise self._rounds.error(e) from None
        else:
            self._beat()
            replies = self._rounds.run(*self._begin_commands(session_id, turn_id, client))
        history = exchanges_from_json(replies[1]) if self.history_turns else []
        record = self._claimed(replies[-3:], client, session_id, turn_id, time.time()) \
            if turn_id else None
        return Begun(record, _json_dict(replies[0]), history)

    def send_begin(self, session_id: str, turn_id: str, client: str = "") -> Optional[SentRound]:
        """IO loop, as a turn goes to a worker that is free: `begin`'s commands written now,
        so that Redis answers while the worker picks the turn up (bench_store.py: the round
        trip otherwise comes after the hand-off); None when writing would wait (no connection
        kept for it yet, the heartbeat's first write not made) and on a cluster
        (hub/redis_connections.py): the worker begins as usual."""
        if self._heartbeat is None or self._kept is None:
            return None
        return self._kept.send(tuple(self._begin_commands(session_id, turn_id, client)))

    def unclaim(self, session_id: str, turn_id: str, client: str = "") -> None:
        """A record this hub claimed for a turn it did not run after all (it ended while
        queued, or its satellite went): gone, so that a resend of the turn runs, here or on
        another replica; unless it is no longer this hub's claim (a replica took it over
        while this hub's alive key had lapsed), checked by value in a script: the rare path,
        a script's cost is no matter."""
        prefix = self._prefix(session_id)
        self._script("UNCLAIM", prefix,
                     [turn_key(prefix, session_id, turn_id), turns_key(prefix, client)],
                     [self._running, member(session_id, turn_id)])

    def _begin_commands(self, session_id: str, turn_id: str, client: str) -> List[tuple]:
        """`begin`'s commands: the Session, the history, and the claim (for a turn id)."""
        prefix = self._prefix(session_id)
        commands: List[tuple] = [("GET", session_key(prefix, session_id))]
        if self.history_turns:
            commands.append(("LRANGE", history_key(prefix, session_id), 0, -1))
        if turn_id:
            commands += self._claim(client, session_id, turn_id, time.time())
        return commands

    def finish(self, session_id: str, turn_id: str, exchange: Exchange, sentences: List[str],
               earlier: List[Exchange], keep_exchange: bool, client: str = "") -> None:
        """The exchange kept and the record done (durable: acknowledged by a replica, or
        ConversationStoreError); the session marked the client's most recent (the least
        recently used beyond the cap evicted), and, when the client is at its record cap, its
        oldest finished records dropped (a sixteenth of the cap, at least one), so that the
        next claims fit without a script."""
        prefix = self._prefix(session_id)
        commands = []
        if keep_exchange and self.history_turns:
            commands += self._append(session_id, exchange, earlier)
        if turn_id:
            done = TurnRecord(DONE, self.owner, list(sentences), exchange.ended)
            commands += [("SET", turn_key(prefix, session_id, turn_id), record_to_json(done),
                          "EX", int(TURN_RECORD_TTL)),
                         ("EXPIRE", turns_key(prefix, client), int(TURN_RECORD_TTL)),
                         ("ZCARD", turns_key(prefix, client))]
        cap, now = self._session_cap(client), time.time()
        if cap:
            commands += self._touch(prefix, client, session_id, now)
        if not commands:
            return
        replies = self._rounds.run(*commands, durable=self.durable and bool(
            turn_id or keep_exchange and self.history_turns))
        if cap:
            self._evict_if_over(replies[-3:], prefix, client, now)
            replies = replies[:-3]
        records = self.max_turn_records_per_client
        if turn_id and replies[-1] >= records:  # room for the next claims: a script every
            self._script("MAKE_ROOM", prefix, [turns_key(prefix, client)], [  # records/16
                records - max(1, records // 16), int(TURN_RECORD_TTL), now, ""])   # turns

    def _touch(self, prefix: str, client: str, session_id: str, now: float) -> List[tuple]:
        """The commands that mark the session the client's most recent and count the client's
        sessions (ZADD's reply: 1 when it is new to the client's set)."""
        key = sessions_key(prefix, client)
        return [("ZADD", key, now, session_id), ("EXPIRE", key, self._ttl), ("ZCARD", key)]

    def _evict_if_over(self, replies: List[Any], prefix: str, client: str, now: float) -> None:
        """A session new to the client's set that took it past its cap: the least recently
        used go, with their keys."""
        added, _expire, count = replies
        if added and count > self.max_sessions_per_client:
            self._script("EVICT_SESSIONS", prefix,
                         [sessions_key(prefix, client), turns_key(prefix, client)],
                         [self.max_sessions_per_client, self._ttl, now])

    def _claim(self, client: str, session_id: str, turn_id: str, now: float) -> List[tuple]:
        """The commands that claim a turn's record (SET NX) and count the client's records."""
        prefix = self._prefix(session_id)
        return [("SET", turn_key(prefix, session_id, turn_id), self._running, "NX", "EX",
                 int(TURN_RECORD_TTL)),
                ("ZADD", turns_key(prefix, client), now, member(session_id, turn_id)),
                ("ZCARD", turns_key(prefix, client))]

    def _claimed(self, replies: List[Any], client: str, session_id: str, turn_id: str,
                 now: float) -> Optional[TurnRecord]:
        """None when the claim started the record (room made when the client went past its
        cap: many of its turns at once), else the record there is; TurnRecordsFull when only
        running ones are left."""
        claimed, _added, count = replies
        if not claimed:
            return self.turn_record(session_id, turn_id)
        prefix = self._prefix(session_id)
        if count > self.max_turn_records_per_client and self._script(
                "MAKE_ROOM", prefix, [turns_key(prefix, client)], [
                    self.max_turn_records_per_client, int(TURN_RECORD_TTL), now,
                    member(session_id, turn_id)]) != 1:
            raise TurnRecordsFull(
                f"this client's {self.max_turn_records_per_client} turn records "
                "(max_turn_records_per_client) all belong to turns still running; try again "
                "when one has ended")
        return None

    def _session_cap(self, client: str) -> int:
        """The client's session cap (0: none, for sessions of no client)."""
        return self.max_sessions_per_client if client else 0

    def _append(self, session_id: str, exchange: Exchange,
                earlier: List[Exchange]) -> List[tuple]:
        """The commands that append `exchange` to the history that was `earlier`, within the
        bounds, and renew its TTL."""
        key = history_key(self._prefix(session_id), session_id)
        drop = bounded(earlier, exchange, self.history_turns, self.history_bytes)
        commands: List[tuple] = [("RPUSH", key,
                                  exchange_to_json(clip(exchange, self.history_bytes)))]
        if drop:
            commands.append(("LTRIM", key, drop, -1))
        commands.append(("EXPIRE", key, self._ttl))
        return commands

    def keep_session(self, session_id: str, session: Dict[str, Any], client: str = "") -> None:
        self._rounds.run(("SET", session_key(self._prefix(session_id), session_id),
                          json.dumps(session), "EX", self._ttl), durable=self.durable)

    def forget(self, session_id: str) -> None:
        """Kept until its TTL: the satellite may continue on another replica."""

    def secret(self) -> bytes:
        if self._secret is None:
            self._rounds.call("set", SECRET, secrets.token_hex(32), nx=True)
            value = self._rounds.call("get", SECRET)
            try:
                secret = bytes.fromhex(value or "")
            except ValueError:
                secret = b""
            if len(secret) < 32:
                raise ConversationStoreError(
                    f"the hub secret in the conversation store at {self._where} is not one "
                    f"this plugin wrote; delete the key {SECRET} and restart the hubs")
            self._secret = secret
        return self._secret

    def ping(self) -> bool:
        """A PING within PING_TIMEOUT (connect and reply); False when Redis does not answer.
        On a cluster, the node redis-py sends keyless commands to must say `cluster_state:ok`
        (every slot served): a PING alone succeeds on a live node of a cluster that has lost
        a primary, while every turn of that primary's slots fails."""
        with self._ping_lock:
            try:
                if self._cluster:
                    return self._pinger.cluster_info().get("cluster_state") == "ok"
                return bool(self._pinger.ping())
            except STORE_ERRORS:
                return False

    def close(self) -> None:
        self._closed.set()
        if self._kept is not None:
            self._kept.close()
        self._pinger.close()
        try:
            self._redis.delete(alive_key(self.owner))   # its turns are free to take over now
        except STORE_ERRORS:
            pass
        self._redis.close()

    # ---- turn records ----
    def claim_turn(self, session_id: str, turn_id: str, client: str = "") -> Optional[TurnRecord]:
        now = time.time()
        replies = self._rounds.run(
            *self._claim(client, session_id, turn_id, now),
            ("EXPIRE", turns_key(self._prefix(session_id), client), int(TURN_RECORD_TTL)))
        return self._claimed(replies[:3], client, session_id, turn_id, now)

    def take_over(self, session_id: str, turn_id: str) -> bool:
        """The record made this hub's if it is still the running one of an owner whose alive
        key lapsed: the check is by value in a script (hub/redis_scripts.TAKE_OVER), so it
        touches only the record's own key, on a cluster too (the owner's alive key is in
        another slot)."""
        key = turn_key(self._prefix(session_id), session_id, turn_id)
        raw = self._rounds.call("get", key)
        record = record_from_json(raw)
        if record is None or record.state != RUNNING or \
                self._rounds.call("exists", alive_key(record.owner)):
            return False
        return self._script("TAKE_OVER", self._prefix(session_id), [key],
                            [raw, self._running, int(TURN_RECORD_TTL)]) == 1

    def turn_record(self, session_id: str, turn_id: str) -> Optional[TurnRecord]:
        record = record_from_json(self._rounds.call(
            "get", turn_key(self._prefix(session_id), session_id, turn_id)))
        if record is None:
            return None
        if record.state == RUNNING and record.owner != self.owner:
            record.owner_alive = bool(self._rounds.call("exists",
                                                        alive_key(record.owner)))
        return record

    def _beat(self) -> None:
        """Keep `alive:<owner>` while this hub runs: a replica whose key lapsed is dead, and
        its running turns may be taken over."""
        if self._heartbeat is not None:
            return
        with self._heartbeat_lock:
            if self._heartbeat is None:
                self._rounds.call("set", alive_key(self.owner), "1", ex=ALIVE_FOR)
                self._heartbeat = threading.Thread(target=self._keep_alive, daemon=True,
                                                   name="hivemind-chat-store-heartbeat")
                self._heartbeat.start()

    def _keep_alive(self) -> None:
        while not self._closed.wait(HEARTBEAT):
            try:
                self._redis.set(alive_key(self.owner), "1", ex=ALIVE_FOR)
            except STORE_ERRORS:
                pass     # Redis is down: turns fail anyway; renewed when it is back

    def _script(self, name: str, prefix: str, keys: List[str], args: List[Any]) -> Any:
        return self._rounds.script(self._scripts[name], prefix, keys, args)


class _Script:
    """A script's text and SHA1, what EVALSHA and SCRIPT LOAD need (redis-py's Script
    objects want a client of one kind; this works for both)."""

    def __init__(self, text: str):
        self.script = text
        self.sha = hashlib.sha1(text.encode("utf-8")).hexdigest()


def _json_dict(raw: Any) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(raw) if raw else None
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None
