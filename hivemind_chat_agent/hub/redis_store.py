"""The conversation store on Redis (hub/conversation_store.py has the contract), for hubs that
share conversations: replicas behind one address.

Keys, under `hivemind-chat:` in the URL's database:
    history:<engine session id>   a list of JSON [user, assistant, ended], oldest first
    session:<engine session id>   the hub-kept OVOS Session, JSON
    secret                        the hub secret, hex, set once by whichever hub comes first
    turn:<n>:<session>:<turn id>  a turn's record: JSON {state, owner, sentences, ended}; <n> is
                                  the session id's length in bytes, so ids with ':' in them
                                  never name another turn's record
    sessions:<client>             the client's sessions, by last turn (max_sessions_per_client)
    turns:<client>                the client's turn records, by last write
                                  (max_turn_records_per_client)
    alive:<hub id>                present while that hub runs (renewed every second, 3 s TTL)
Engine session ids are keyed digests of the access key and the declared id (core/satellites.py)
and <client> is the digest alone: no access key or utterance is in a key name, and every id in
one is bounded (core/limits.py). Every write renews its conversation's keys for `session_ttl`.
A turn costs two round trips of plain commands: one as it begins (the Session and history read,
its record claimed and counted) and one as it ends, after the answer (the exchange appended and
trimmed, the record done, the session marked the client's most recent); a third when the engine
changed the Session. A client at one of its caps costs one script more (hub/redis_scripts.py),
as a turn ends: a new session past `max_sessions_per_client`, or a client at
`max_turn_records_per_client` (its oldest finished records go, a sixteenth of the cap, so that
the next claims fit); and as a turn begins when many of its turns run at once.
"""
import json
import secrets
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import redis

from hivemind_chat_agent.core.transcript import Exchange, clip
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub import redis_scripts
from hivemind_chat_agent.hub.conversation_store import (
    DONE,
    KEY_PREFIX,
    MAX_TURN_RECORDS_PER_CLIENT,
    PING_TIMEOUT,
    REDIS_TIMEOUT,
    RUNNING,
    TURN_RECORD_TTL,
    Begun,
    TurnRecord,
    TurnRecordsFull,
    bounded,
    exchange_from_json,
    exchange_to_json,
    record_from_json,
    record_to_json,
)
from hivemind_chat_agent.hub.redis_urls import redis_client, shown_url

HEARTBEAT = 1.0        # seconds between this hub's "alive" renewals
ALIVE_FOR = 3          # seconds an "alive" key outlives its last renewal


class RedisStore:
    shared = True    # every replica behind one address reads it
    def __init__(self, url: str, history_turns: int, history_bytes: int, session_ttl: float,
                 max_sessions_per_client: int = 256,
                 max_turn_records_per_client: int = MAX_TURN_RECORDS_PER_CLIENT):
        self._where = shown_url(url)
        self._redis = redis_client(
            url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT,
            health_check_interval=30, decode_responses=True)
        self.history_turns = history_turns
        self.history_bytes = history_bytes
        self._ttl = max(1, int(session_ttl))
        self.max_sessions_per_client = max_sessions_per_client
        self.max_turn_records_per_client = max_turn_records_per_client
        self._scripts = {name: self._redis.register_script(getattr(redis_scripts, name))
                         for name in ("MAKE_ROOM", "EVICT_SESSIONS")}
        self._secret: Optional[bytes] = None
        self.owner = uuid.uuid4().hex          # this hub, as the owner of the turns it runs
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
        raw = self._call(self._redis.lrange, _history(session_id), 0, -1)
        return [e for e in map(exchange_from_json, raw) if e is not None]

    def record(self, session_id: str, exchange: Exchange) -> None:
        """Appended, then the oldest trimmed to the bounds. Turns of one session come one at a
        time (the satellite waits for each answer), so read-then-trim needs no transaction."""
        if self.history_turns:
            self._run(*self._append(session_id, exchange, self.history(session_id)))

    def begin(self, session_id: str, turn_id: str, client: str = "") -> Begun:
        """The Session and history read and the record claimed (and counted, for a client
        with many turns at once), in one round trip; the rest of the bookkeeping waits for
        `finish`, after the answer."""
        self._beat()
        commands: List[tuple] = [("GET", _session(session_id))]
        if self.history_turns:
            commands.append(("LRANGE", _history(session_id), 0, -1))
        now = time.time()
        if turn_id:
            commands += self._claim(client, session_id, turn_id, now)
        replies = self._run(*commands)
        history = [e for e in map(exchange_from_json, replies[1])
                   if e is not None] if self.history_turns else []
        record = self._claimed(replies[-3:], client, session_id, turn_id, now) \
            if turn_id else None
        return Begun(record, _json_dict(replies[0]), history)

    def finish(self, session_id: str, turn_id: str, exchange: Exchange, sentences: List[str],
               earlier: List[Exchange], keep_exchange: bool, client: str = "") -> None:
        """The exchange kept and the record done; the session marked the client's most
        recent (the least recently used beyond the cap evicted), and, when the client is at
        its record cap, its oldest finished records dropped (a sixteenth of the cap, at least
        one), so that the next claims fit without a script."""
        commands = []
        if keep_exchange and self.history_turns:
            commands += self._append(session_id, exchange, earlier)
        if turn_id:
            done = TurnRecord(DONE, self.owner, list(sentences), exchange.ended)
            commands += [("SET", _turn(session_id, turn_id), record_to_json(done), "EX",
                          int(TURN_RECORD_TTL)),
                         ("EXPIRE", _turns(client), int(TURN_RECORD_TTL)),
                         ("ZCARD", _turns(client))]
        cap, now = self._session_cap(client), time.time()
        if cap:
            commands += self._touch(client, session_id, now)
        if not commands:
            return
        replies = self._run(*commands)
        if cap:
            self._evict_if_over(replies[-3:], client, now)
            replies = replies[:-3]
        records = self.max_turn_records_per_client
        if turn_id and replies[-1] >= records:  # room for the next claims: a script every
            self._script("MAKE_ROOM", [_turns(client)], [   # records/16 turns, not every one
                records - max(1, records // 16), int(TURN_RECORD_TTL), now, ""])

    def _touch(self, client: str, session_id: str, now: float) -> List[tuple]:
        """The commands that mark the session the client's most recent and count the client's
        sessions (ZADD's reply: 1 when it is new to the client's set)."""
        return [("ZADD", _sessions(client), now, session_id),
                ("EXPIRE", _sessions(client), self._ttl), ("ZCARD", _sessions(client))]

    def _evict_if_over(self, replies: List[Any], client: str, now: float) -> None:
        """A session new to the client's set that took it past its cap: the least recently
        used go, with their keys."""
        added, _expire, count = replies
        if added and count > self.max_sessions_per_client:
            self._script("EVICT_SESSIONS", [_sessions(client), _turns(client)],
                         [self.max_sessions_per_client, self._ttl, now])

    def _claim(self, client: str, session_id: str, turn_id: str, now: float) -> List[tuple]:
        """The commands that claim a turn's record (SET NX) and count the client's records."""
        mine = record_to_json(TurnRecord(RUNNING, self.owner))
        return [("SET", _turn(session_id, turn_id), mine, "NX", "EX", int(TURN_RECORD_TTL)),
                ("ZADD", _turns(client), now, _member(session_id, turn_id)),
                ("ZCARD", _turns(client))]

    def _claimed(self, replies: List[Any], client: str, session_id: str, turn_id: str,
                 now: float) -> Optional[TurnRecord]:
        """None when the claim started the record (room made when the client went past its
        cap: many of its turns at once), else the record there is; TurnRecordsFull when only
        running ones are left."""
        claimed, _added, count = replies
        if not claimed:
            return self.turn_record(session_id, turn_id)
        if count > self.max_turn_records_per_client and self._script(
                "MAKE_ROOM", [_turns(client)], [self.max_turn_records_per_client,
                                                int(TURN_RECORD_TTL), now,
                                                _member(session_id, turn_id)]) != 1:
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
        key = _history(session_id)
        drop = bounded(earlier, exchange, self.history_turns, self.history_bytes)
        commands: List[tuple] = [("RPUSH", key,
                                  exchange_to_json(clip(exchange, self.history_bytes)))]
        if drop:
            commands.append(("LTRIM", key, drop, -1))
        commands.append(("EXPIRE", key, self._ttl))
        return commands

    def keep_session(self, session_id: str, session: Dict[str, Any], client: str = "") -> None:
        self._run(("SET", _session(session_id), json.dumps(session), "EX", self._ttl))

    def forget(self, session_id: str) -> None:
        """Kept until its TTL: the satellite may continue on another replica."""

    def secret(self) -> bytes:
        if self._secret is None:
            key = KEY_PREFIX + "secret"
            self._call(self._redis.set, key, secrets.token_hex(32), nx=True)
            value = self._call(self._redis.get, key)
            try:
                secret = bytes.fromhex(value or "")
            except ValueError:
                secret = b""
            if len(secret) < 32:
                raise ConversationStoreError(
                    f"the hub secret in the conversation store at {self._where} is not one "
                    f"this plugin wrote; delete the key {key} and restart the hubs")
            self._secret = secret
        return self._secret

    def ping(self) -> bool:
        """A PING within PING_TIMEOUT (connect and reply); False when Redis does not answer."""
        with self._ping_lock:
            try:
                return bool(self._pinger.ping())
            except (redis.RedisError, OSError):
                return False

    def close(self) -> None:
        self._closed.set()
        self._pinger.close()
        try:
            self._redis.delete(_alive(self.owner))   # its turns are free to take over at once
        except redis.RedisError:
            pass
        self._redis.close()

    # ---- turn records ----
    def claim_turn(self, session_id: str, turn_id: str, client: str = "") -> Optional[TurnRecord]:
        now = time.time()
        replies = self._run(*self._claim(client, session_id, turn_id, now),
                            ("EXPIRE", _turns(client), int(TURN_RECORD_TTL)))
        return self._claimed(replies[:3], client, session_id, turn_id, now)

    def take_over(self, session_id: str, turn_id: str) -> bool:
        key = _turn(session_id, turn_id)
        try:
            with self._redis.pipeline() as pipe:
                pipe.watch(key)
                record = record_from_json(pipe.get(key))
                if record is None or record.state != RUNNING or pipe.exists(_alive(record.owner)):
                    return False
                pipe.multi()
                pipe.set(key, record_to_json(TurnRecord(RUNNING, self.owner)),
                         ex=int(TURN_RECORD_TTL))
                pipe.execute()
                return True
        except redis.WatchError:
            return False
        except redis.RedisError as e:
            raise self._error(e) from None

    def turn_record(self, session_id: str, turn_id: str) -> Optional[TurnRecord]:
        record = record_from_json(self._call(self._redis.get, _turn(session_id, turn_id)))
        if record is None:
            return None
        if record.state == RUNNING and record.owner != self.owner:
            record.owner_alive = bool(self._call(self._redis.exists, _alive(record.owner)))
        return record

    def _beat(self) -> None:
        """Keep `alive:<owner>` while this hub runs: a replica whose key lapsed is dead, and
        its running turns may be taken over."""
        if self._heartbeat is not None:
            return
        with self._heartbeat_lock:
            if self._heartbeat is None:
                self._call(self._redis.set, _alive(self.owner), "1", ex=ALIVE_FOR)
                self._heartbeat = threading.Thread(target=self._keep_alive, daemon=True,
                                                   name="hivemind-chat-store-heartbeat")
                self._heartbeat.start()

    def _keep_alive(self) -> None:
        while not self._closed.wait(HEARTBEAT):
            try:
                self._redis.set(_alive(self.owner), "1", ex=ALIVE_FOR)
            except redis.RedisError:
                pass     # Redis is down: turns fail anyway; renewed when it is back

    def _run(self, *commands: tuple) -> List[Any]:
        """`commands` in one round trip on one pooled connection, their replies in order: a
        pipeline without redis-py's pipeline objects, which cost twice the CPU per turn
        (benchmarks/bench_store.py; the begin and the end of every turn come here). A
        connection that failed is dropped, never handed back with unread replies."""
        pool = self._redis.connection_pool
        try:
            try:
                connection = pool.get_connection()
            except TypeError:      # redis-py before 5.3 wants a command name (any)
                connection = pool.get_connection("GET")
        except redis.RedisError as e:
            raise self._error(e) from None
        try:
            connection.send_packed_command(connection.pack_commands(commands))
            return [connection.read_response() for _ in commands]
        except redis.exceptions.NoScriptError:
            if len(commands) > 1:      # replies left unread: the connection is not reusable
                connection.disconnect()
            raise
        except (redis.RedisError, OSError) as e:
            connection.disconnect()
            raise self._error(e) from None
        finally:
            pool.release(connection)

    def _script(self, name: str, keys: List[str], args: List[Any]) -> Any:
        """One of hub/redis_scripts.py's scripts, its first argument the key prefix: EVALSHA
        on the packed path above (redis-py's Script objects cost this hub about 0.1 ms more
        per turn), loaded again when Redis lost it (a restart)."""
        script = self._scripts[name]
        command = ("EVALSHA", script.sha, len(keys), *keys, KEY_PREFIX, *args)
        try:
            return self._run(command)[0]
        except redis.exceptions.NoScriptError:
            self._call(self._redis.script_load, script.script)
            return self._run(command)[0]

    def _call(self, method, *args, **kwargs) -> Any:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as e:
            raise self._error(e) from None

    def _error(self, e: Exception) -> ConversationStoreError:
        return ConversationStoreError(
            f"the conversation store at {self._where} failed ({type(e).__name__}: "
            f"{str(e)[:200]}); turns fail until it answers again, then the hub continues "
            "by itself")


def _json_dict(raw: Any) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(raw) if raw else None
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _member(session_id: str, turn_id: str) -> str:
    """A turn record's name: the session id's length in bytes first, so that no two
    (session, turn id) pairs share one whatever ':' they contain."""
    return f"{len(session_id.encode('utf-8'))}:{session_id}:{turn_id}"


def _session(session_id: str) -> str:
    return f"{KEY_PREFIX}session:{session_id}"


def _turn(session_id: str, turn_id: str) -> str:
    return f"{KEY_PREFIX}turn:{_member(session_id, turn_id)}"


def _sessions(client: str) -> str:
    return f"{KEY_PREFIX}sessions:{client}"


def _turns(client: str) -> str:
    return f"{KEY_PREFIX}turns:{client}"


def _alive(owner: str) -> str:
    return f"{KEY_PREFIX}alive:{owner}"


def _history(session_id: str) -> str:
    return f"{KEY_PREFIX}history:{session_id}"

