"""Where the hub plugin keeps what a conversation needs between turns, so that any hub sharing
the store can continue it: the transcript the engine is given (core/transcript.py), the OVOS
Session the hub keeps for the satellite (the conversation fields a stateless satellite does not
echo), and the hub secret that names engine sessions (core/satellites.engine_session_id).

Two backends, chosen by `conversation_store` in the plugin's config:
- `"memory"` (the default): this process only. Transcripts live in a dict, Sessions in OVOS's
  `SessionManager`, the secret in a file beside hivemind-core's database (hub/secret.py). What
  a satellite session left is released when the hub forgets the session (TTL, disconnect, the
  per-client cap). Turn records are kept per client (hub/turn_table.py).
- `"redis://HOST:PORT/DB"` (extra `[redis]`): shared by every replica behind one address. Each
  conversation's keys expire `session_ttl` after its last turn rather than on disconnect (the
  satellite may be on its way to another replica). An unreachable Redis raises
  `ConversationStoreError`: the turn fails with reason "store_unavailable" and the satellite is
  told; the `redis` client's connection pool reconnects by itself when Redis is back. Redis
  holds `max_sessions_per_client` itself, across replicas: a client's least recently used
  session beyond it is deleted with its keys.

`client` (a client's fingerprint, core/satellites.client_fingerprint; "" for none) names whose
bounds a session and its turn records count against: each client keeps at most
`max_sessions_per_client` sessions (Redis; the plugin's SatelliteSessions in memory) and
`max_turn_records_per_client` turn records, so one client's churn never evicts another's.
A claim past a client's cap that only running records fill raises `TurnRecordsFull`.

Methods are called from the plugin's worker threads and the IO loop; both backends are
thread-safe.
"""
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol

from ovos_bus_client.session import SessionManager

from hivemind_chat_agent.core.transcript import Exchange, Transcripts, clip, oldest_over
from hivemind_chat_agent.hub.secret import hub_secret
from hivemind_chat_agent.hub.turn_table import (
    DONE,
    RUNNING,
    TurnRecord,
    TurnRecordsFull,
    TurnRecordTable,
)

__all__ = ["ConversationStore", "MemoryStore", "TurnRecord", "TurnRecordsFull", "Begun",
           "RUNNING", "DONE"]

KEY_PREFIX = "hivemind-chat:"
REDIS_TIMEOUT = 2.0    # seconds: a Redis that does not answer fails the turn, never hangs it
PING_TIMEOUT = 0.5     # seconds a readiness ping waits: below HAProxy's 1 s check interval
TURN_RECORD_TTL = 600.0   # a turn's record answers a repeated id for this long after its end
MAX_TURN_RECORDS_PER_CLIENT = 256   # the default of max_turn_records_per_client


@dataclass
class Begun:
    """What a turn starts from, read in one go: the turn's record (None: this hub runs it, and
    its record is started if it has an id), the Session the hub kept, the kept exchanges."""
    record: Optional[TurnRecord]
    session: Optional[Dict[str, Any]]
    history: List[Exchange]


class ConversationStore(Protocol):
    shared: bool
    """Other hubs read this store too (replicas): a conversation lives on by its TTL, not by
    whether this hub still follows its session."""

    def begin(self, session_id: str, turn_id: str, client: str = "",
              sent: Optional[Any] = None) -> Begun:
        """A turn of `client`'s session starts (`turn_id` "" for one without an id: no
        record). TurnRecordsFull: its record could not be started (see the module). `sent`:
        what `send_begin` returned for this turn (its replies are read instead)."""

    def send_begin(self, session_id: str, turn_id: str, client: str = "") -> Optional[Any]:
        """IO loop, never waiting: `begin` started now for a turn a free worker takes up at
        once, which then passes the result to `begin`; None when this store cannot (the
        worker begins as usual)."""

    def unclaim(self, session_id: str, turn_id: str, client: str = "") -> None:
        """The record `begin` claimed for a turn that then did not run is given up."""

    def finish(self, session_id: str, turn_id: str, exchange: Exchange, sentences: List[str],
               earlier: List[Exchange], keep_exchange: bool, client: str = "") -> None:
        """A turn this hub ran ended: its exchange joins the history (if `keep_exchange`,
        bounded; `earlier` is the history the turn began with; not if the client's session
        was evicted meanwhile) and, with a `turn_id`, its record is done with `sentences`
        and how it ended (`exchange.ended`)."""

    def history(self, session_id: str) -> List[Exchange]:
        """The session's kept exchanges, oldest first."""

    def record(self, session_id: str, exchange: Exchange) -> None:
        """Keep an exchange, within the bounds of history_turns and history_bytes."""

    def keep_session(self, session_id: str, session: Dict[str, Any], client: str = "") -> None:
        """The Session as the engine left it after a turn (unless the session was evicted)."""

    def forget(self, session_id: str) -> None:
        """This hub no longer follows the session (its TTL, a disconnect, the cap)."""

    def secret(self) -> bytes:
        """The hub secret engine session ids are keyed with, the same for every hub sharing
        the store."""

    def claim_turn(self, session_id: str, turn_id: str, client: str = "") -> Optional[TurnRecord]:
        """None: no record of this turn id yet; one is started, owned by this hub, which runs
        the turn. Otherwise the record there is (another attempt of the same turn).
        TurnRecordsFull: none could be started."""

    def take_over(self, session_id: str, turn_id: str) -> bool:
        """The record's owner is gone: make it this hub's, to run the turn again; False if
        another hub got there first or the record changed."""

    def turn_record(self, session_id: str, turn_id: str) -> Optional[TurnRecord]:
        """The record as it stands, if any."""

    def ping(self) -> bool:
        """Whether the store answers now, within PING_TIMEOUT; never raises. Cheap: the
        health endpoint's `/readyz` asks it at every check of the load balancer."""

    def close(self) -> None:
        """Release connections; the store is not used again."""


class MemoryStore:
    """One hub's memory: a transcript dict under a lock, OVOS's SessionManager, a secret file,
    each client's turn records (this process is their only owner)."""

    shared = False

    def __init__(self, history_turns: int, history_bytes: int, data_home: Callable[[], str],
                 max_turn_records_per_client: int = MAX_TURN_RECORDS_PER_CLIENT,
                 clock: Callable[[], float] = time.monotonic):
        self.transcripts = Transcripts(history_turns, history_bytes)
        self._lock = threading.Lock()
        self._data_home = data_home
        self._secret: Optional[bytes] = None
        self.turns = TurnRecordTable(max_turn_records_per_client, TURN_RECORD_TTL, clock)

    def history(self, session_id: str) -> List[Exchange]:
        with self._lock:
            return self.transcripts.history(session_id)

    def record(self, session_id: str, exchange: Exchange) -> None:
        with self._lock:
            self.transcripts.record(session_id, exchange)

    def begin(self, session_id: str, turn_id: str, client: str = "",
              sent: Optional[Any] = None) -> Begun:
        record = self.claim_turn(session_id, turn_id, client) if turn_id else None
        kept = SessionManager.sessions.get(session_id)
        return Begun(record, kept.serialize() if kept is not None else None,
                     self.history(session_id))

    def finish(self, session_id: str, turn_id: str, exchange: Exchange, sentences: List[str],
               earlier: List[Exchange], keep_exchange: bool, client: str = "") -> None:
        if keep_exchange:
            self.record(session_id, exchange)
        if turn_id:
            with self._lock:
                self.turns.done(session_id, turn_id, sentences, exchange.ended)

    def send_begin(self, session_id: str, turn_id: str, client: str = "") -> None:
        """None: `begin` waits for nothing here."""
        return None

    def unclaim(self, session_id: str, turn_id: str, client: str = "") -> None:
        with self._lock:
            self.turns.release(session_id, turn_id)

    def keep_session(self, session_id: str, session: Dict[str, Any], client: str = "") -> None:
        """Nothing to do: the engine's Session is in SessionManager already."""

    def forget(self, session_id: str) -> None:
        with self._lock:
            self.transcripts.forget(session_id)

    def secret(self) -> bytes:
        if self._secret is None:
            self._secret = hub_secret(self._data_home())
        return self._secret

    def ping(self) -> bool:
        return True      # this process's memory answers while the process does

    def close(self) -> None:
        pass

    def claim_turn(self, session_id: str, turn_id: str, client: str = "") -> Optional[TurnRecord]:
        with self._lock:
            return self.turns.claim(client, session_id, turn_id)

    def take_over(self, session_id: str, turn_id: str) -> bool:
        return False     # the owner is this process, alive as long as the store is

    def turn_record(self, session_id: str, turn_id: str) -> Optional[TurnRecord]:
        with self._lock:
            return self.turns.get(session_id, turn_id)


def record_to_json(record: TurnRecord) -> str:
    return json.dumps({"state": record.state, "owner": record.owner,
                       "sentences": record.sentences, "ended": record.ended})


def record_from_json(raw: Any) -> Optional[TurnRecord]:
    """A turn record as stored, or None for an entry that is not one."""
    try:
        data = json.loads(raw)
        record = TurnRecord(str(data["state"]), str(data.get("owner", "")),
                            [s for s in data.get("sentences", []) if isinstance(s, str)],
                            str(data.get("ended", "")))
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    return record if record.state in (RUNNING, DONE) else None


def exchange_to_json(exchange: Exchange) -> str:
    return json.dumps([exchange.user, exchange.assistant, exchange.ended])


def exchange_from_json(raw: Any) -> Optional[Exchange]:
    """An exchange as stored, or None for an entry that is not one (never trusted blindly)."""
    try:
        return _exchange(json.loads(raw))
    except (TypeError, ValueError):
        return None


def exchanges_from_json(raws: List[Any]) -> List[Exchange]:
    """The exchanges of a stored history, in order, leaving out entries that are not one. One
    parse of them all (a third of the cost of one parse each: this is on every turn's path
    before the engine runs); one parse each when that fails or yields another count (no entry
    can yield none, so an equal count is one item an entry)."""
    try:
        parsed = json.loads("[" + ",".join(raws) + "]")
    except (TypeError, ValueError):
        parsed = None
    if not isinstance(parsed, list) or len(parsed) != len(raws):  # entries spanning others
        return [e for e in map(exchange_from_json, raws) if e is not None]
    return [e for e in map(_exchange, parsed) if e is not None]


def _exchange(item: Any) -> Optional[Exchange]:
    """A parsed entry as an exchange: a list of three strings, nothing else (a string or an
    object of three items is not one)."""
    if isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item):
        return Exchange(*item)
    return None


def bounded(exchanges: List[Exchange], new: Exchange, history_turns: int,
            history_bytes: int) -> int:
    """How many of the oldest of `exchanges` + [new] go to keep the bounds."""
    kept = exchanges + [clip(new, history_bytes)]
    over_turns = max(0, len(kept) - history_turns)
    return over_turns + oldest_over(kept[over_turns:], history_bytes)
