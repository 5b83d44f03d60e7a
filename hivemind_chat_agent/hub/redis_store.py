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
A turn costs two round trips: one script as it begins (the client's session cap kept, its
record claimed, the Session and history read) and one as it ends (the exchange appended and
trimmed, the record done); a third when the engine changed the Session. The scripts are in
hub/redis_scripts.py.
"""
import json
import secrets
import threading
import uuid
from typing import Any, Dict, List, Optional
from urllib.parse import urlsplit, urlunsplit

import redis

from hivemind_chat_agent.core.transcript import Exchange, clip
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub import redis_scripts
from hivemind_chat_agent.hub.conversation_store import (
    DONE, KEY_PREFIX, MAX_TURN_RECORDS_PER_CLIENT, REDIS_TIMEOUT, RUNNING, TURN_RECORD_TTL,
    Begun, TurnRecord, TurnRecordsFull, bounded, exchange_from_json, exchange_to_json,
    record_from_json, record_to_json)

HEARTBEAT = 1.0        # seconds between this hub's "alive" renewals
ALIVE_FOR = 3          # seconds an "alive" key outlives its last renewal


class RedisStore:
    def __init__(self, url: str, history_turns: int, history_bytes: int, session_ttl: float,
                 max_sessions_per_client: int = 256,
                 max_turn_records_per_client: int = MAX_TURN_RECORDS_PER_CLIENT):
        self._where = _without_password(url)
        self._redis = redis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT, socket_connect_timeout=REDIS_TIMEOUT,
            health_check_interval=30, decode_responses=True)
        self.history_turns = history_turns
        self.history_bytes = history_bytes
        self._ttl = max(1, int(session_ttl))
        self.max_sessions_per_client = max_sessions_per_client
        self.max_turn_records_per_client = max_turn_records_per_client
        self._scripts = {name: self._redis.register_script(getattr(redis_scripts, name))
                         for name in ("BEGIN", "CLAIM", "FINISH", "KEEP_SESSION")}
        self._secret: Optional[bytes] = None
        self.owner = uuid.uuid4().hex          # this hub, as the owner of the turns it runs
        self._closed = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None
        self._heartbeat_lock = threading.Lock()

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
        self._beat()
        mine = record_to_json(TurnRecord(RUNNING, self.owner)) if turn_id else ""
        raw_session, raw_history, claimed = self._script(
            "BEGIN", [_sessions(client), _turns(client)],
            [session_id, self._ttl, self._session_cap(client), int(bool(self.history_turns)),
             _member(session_id, turn_id) if turn_id else "", mine, int(TURN_RECORD_TTL),
             self.max_turn_records_per_client])
        record = None if claimed == 1 else self._claim_refused(claimed, session_id, turn_id)
        history = [e for e in map(exchange_from_json, raw_history or []) if e is not None]
        return Begun(record, _json_dict(raw_session), history)

    def finish(self, session_id: str, turn_id: str, exchange: Exchange, sentences: List[str],
               earlier: List[Exchange], keep_exchange: bool, client: str = "") -> None:
        kept, drop = "", 0
        if keep_exchange and self.history_turns:
            kept = exchange_to_json(clip(exchange, self.history_bytes))
            drop = bounded(earlier, exchange, self.history_turns, self.history_bytes)
        done = record_to_json(TurnRecord(DONE, self.owner, list(sentences), exchange.ended)) \
            if turn_id else ""
        if kept or done:
            self._script("FINISH", [_sessions(client), _turns(client)],
                         [session_id, int(bool(self._session_cap(client))), self._ttl, kept,
                          drop, _member(session_id, turn_id) if turn_id else "", done,
                          int(TURN_RECORD_TTL)])

    def _session_cap(self, client: str) -> int:
        """The client's session cap (0: none, for sessions of no client)."""
        return self.max_sessions_per_client if client else 0

    def _claim_refused(self, claimed: int, session_id: str, turn_id: str) -> Optional[TurnRecord]:
        """A claim that did not start a record: the record there is (0), or TurnRecordsFull
        (-1: the client's records are all running)."""
        if claimed == -1:
            raise TurnRecordsFull(
                f"this client's {self.max_turn_records_per_client} turn records "
                "(max_turn_records_per_client) all belong to turns still running; try again "
                "when one has ended")
        return self.turn_record(session_id, turn_id)

    def _append(self, session_id: str, exchange: Exchange,
                earlier: List[Exchange]) -> List[tuple]:
        """The commands that append `exchange` to the history that was `earlier`, within the
        bounds, and renew its TTL."""
        key = _history(session_id)
        drop = bounded(earlier, exchange, self.history_turns, self.history_bytes)
        commands = [("RPUSH", key, exchange_to_json(clip(exchange, self.history_bytes)))]
        if drop:
            commands.append(("LTRIM", key, drop, -1))
        commands.append(("EXPIRE", key, self._ttl))
        return commands

    def keep_session(self, session_id: str, session: Dict[str, Any], client: str = "") -> None:
        self._script("KEEP_SESSION", [_sessions(client)],
                     [session_id, int(bool(self._session_cap(client))), self._ttl,
                      json.dumps(session)])

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

    def close(self) -> None:
        self._closed.set()
        try:
            self._redis.delete(_alive(self.owner))   # its turns are free to take over at once
        except redis.RedisError:
            pass
        self._redis.close()

    # ---- turn records ----
    def claim_turn(self, session_id: str, turn_id: str, client: str = "") -> Optional[TurnRecord]:
        claimed = self._script("CLAIM", [_turns(client)], [
            _member(session_id, turn_id), record_to_json(TurnRecord(RUNNING, self.owner)),
            int(TURN_RECORD_TTL), self.max_turn_records_per_client])
        return None if claimed == 1 else self._claim_refused(claimed, session_id, turn_id)

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
        except (redis.RedisError, OSError) as e:
            connection.disconnect()
            raise self._error(e) from None
        finally:
            pool.release(connection)

    def _script(self, name: str, keys: List[str], args: List[Any]) -> Any:
        """One of hub/redis_scripts.py's scripts (EVALSHA; loaded again by redis-py when
        Redis lost it, after a restart), its first argument the key prefix."""
        return self._call(self._scripts[name], keys=keys, args=[KEY_PREFIX, *args])

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


def _without_password(url: str) -> str:
    """The URL as it may be logged: no password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
