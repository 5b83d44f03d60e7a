"""The turn records of one hub's memory store, each client's apart, without I/O (the clock is
injected). hub/turn_records.py says what a record is for: a turn id that reaches the hub again
is answered from it, never run a second time.

Each client (access key) keeps at most `per_client` records. A client over its cap makes room
with its own oldest finished records; a record still running is never dropped, because its
turn, sent again, would run twice. When all of a client's records are running, its new turn is
refused (`TurnRecordsFull`, which the satellite hears as "busy") rather than drop one. One
client's churn therefore never touches another client's records (a table shared by all, 4,096
records, let any client evict the running record of another).

A record lives `ttl` seconds after its last write (claimed or done), as in Redis: a running
one whose turn never ended (its hub died, in Redis) lapses then.
"""
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

from hivemind_chat_agent.errors import HubBusyError

RUNNING, DONE = "running", "done"
Key = Tuple[str, str]     # (engine session id, turn id): a tuple, whatever the ids contain


@dataclass
class TurnRecord:
    """What a hub sharing the store knows of one turn id of one conversation: being run
    (by `owner`, which is alive or not) or done, with the sentences the satellite was sent and
    how it ended (ANSWERED, STOPPED, or an EndReason value)."""
    state: str
    owner: str = ""
    sentences: List[str] = field(default_factory=list)
    ended: str = ""
    owner_alive: bool = True


class TurnRecordsFull(HubBusyError):
    """Every turn record this client may keep belongs to a turn still running: a new turn is
    refused (reason "busy") rather than drop one. Try again when one of them has ended."""


@dataclass
class _Held:
    record: TurnRecord
    client: str
    expires: float


class TurnRecordTable:
    def __init__(self, per_client: int, ttl: float, now: Callable[[], float]):
        if per_client < 1:
            raise ValueError("per_client must be >= 1")
        self.per_client = per_client
        self.ttl = ttl
        self._now = now
        self._held: Dict[Key, _Held] = {}
        # each client's keys, least recently written first (so also soonest to lapse first)
        self._of_client: Dict[str, "OrderedDict[Key, None]"] = {}

    def claim(self, client: str, session_id: str, turn_id: str) -> Optional[TurnRecord]:
        """None: no record of this turn yet, and one is started (running) for `client`.
        Otherwise a copy of the record there is. Raises TurnRecordsFull (nothing changed)
        when the client is at its cap and every one of its records is running."""
        key = (session_id, turn_id)
        now = self._now()
        self._lapse(client, now)
        found = self.get(session_id, turn_id)
        if found is not None:
            return found
        if key in self._held:          # lapsed, on another client's list: gone first
            self._drop(key)
        if self.count(client) >= self.per_client:
            self._make_room(self._of_client[client])
        mine = self._of_client.setdefault(client, OrderedDict())
        self._held[key] = _Held(TurnRecord(RUNNING), client, now + self.ttl)
        mine[key] = None
        return None

    def done(self, session_id: str, turn_id: str, sentences, ended: str) -> None:
        """The turn ended: its record keeps what was said and how it ended, for `ttl`."""
        key = (session_id, turn_id)
        held = self._held.get(key)
        if held is None:
            return         # lapsed meanwhile: nothing to answer a repeat from
        held.record = TurnRecord(DONE, sentences=list(sentences), ended=ended)
        held.expires = self._now() + self.ttl
        self._of_client[held.client].move_to_end(key)

    def release(self, session_id: str, turn_id: str) -> None:
        """A claim given up (its turn did not run): no record, as before the claim."""
        if (session_id, turn_id) in self._held:
            self._drop((session_id, turn_id))

    def get(self, session_id: str, turn_id: str) -> Optional[TurnRecord]:
        """A copy of the record, if there is one that has not lapsed."""
        held = self._held.get((session_id, turn_id))
        if held is None or held.expires <= self._now():
            return None
        return replace(held.record, sentences=list(held.record.sentences))

    def count(self, client: str) -> int:
        return len(self._of_client.get(client, ()))

    def _make_room(self, mine: "OrderedDict[Key, None]") -> None:
        oldest_done = next((k for k in mine if self._held[k].record.state == DONE), None)
        if oldest_done is None:
            raise TurnRecordsFull(
                f"this client's {len(mine)} turn records (max_turn_records_per_client) all "
                "belong to turns still running; try again when one has ended")
        self._drop(oldest_done)

    def _lapse(self, client: str, now: float) -> None:
        """Drop the client's records past their time, oldest first (they lapse in order)."""
        mine = self._of_client.get(client)
        while mine:
            key = next(iter(mine))
            if self._held[key].expires > now:
                break
            self._drop(key)

    def _drop(self, key: Key) -> None:
        held = self._held.pop(key)
        mine = self._of_client[held.client]
        del mine[key]
        if not mine:
            del self._of_client[held.client]
