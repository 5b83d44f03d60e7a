"""The hub plugin's Prometheus metrics (docs/metrics.md: the names and labels are a contract).

`HubMetrics` holds them in a `CollectorRegistry` of its own, never prometheus_client's global
one: two plugins in one process (tests, an embedded hub beside another) each count their own,
and neither collides with whatever else the process registers. The gauges read their value
when scraped (`set_function`): the turns in flight are the plugin's OpenTurns, the sessions its
SatelliteBook, the satellites hivemind-core's connection table, so no turn pays for them and
none can drift.

A turn is counted where it ends (hub/hub_turn.HubTurn._end, the one end whatever ends it), so
each turn once; its outcome label comes from core/health.turn_outcome. `NO_METRICS` stands in
when the `health` setting is off: the plugin then neither imports prometheus_client nor pays
more than a method call per turn.

`hivemind_chat_store_seconds` has a series per operation the store was asked, made at its first
call: `take_over` and `claim_turn` come only with a resent turn, `unclaim` only with Redis's
early begin, the OVOS mode asks no store at all, and eleven histograms made up front were 176
of a scrape's 251 lines and about half its cost (docs/performance.md). `begin` and `finish`,
which every turn asks, are made when the store is wrapped (`TimedStore`), so that Prometheus'
`rate()` counts the first turn's (a series that appears at 1 has no earlier sample to count
from); a rare operation's first call is seen as its series appearing (docs/metrics.md).

`TimedStore` wraps a shared conversation store (Redis; the memory store is not timed, see
hub/protocol.py): each call of the contract is timed under its name
(`hivemind_chat_store_seconds{op}`), and one that raises ConversationStoreError, or a ping that
finds the store silent, counts in `hivemind_chat_store_errors_total`.
"""
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from hivemind_chat_agent.core.health import OUTCOMES
from hivemind_chat_agent.errors import ConversationStoreError

TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FIRST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# the `op` label's values: the contract's operations (docs/metrics.md); EVERY_TURN's are asked by
# every turn, so their series exist from the start
STORE_OPS = ("begin", "finish", "history", "record", "keep_session", "secret", "claim_turn",
             "take_over", "turn_record", "unclaim", "ping")
EVERY_TURN = ("begin", "finish")


class NoMetrics:
    """What a turn reports when metrics are off: nothing."""

    def first_sentence(self, seconds: float) -> None:
        """The turn's first sentence went out `seconds` after its utterance arrived."""

    def turn_ended(self, outcome: str, seconds: float) -> None:
        """A turn ended with `outcome` (core/health.OUTCOMES), `seconds` after it arrived."""

    def store_call(self, op: str, seconds: float, failed: bool) -> None:
        """A conversation store call `op` took `seconds`; `failed`: the store did not answer."""

    def store_ops_expected(self, ops: Tuple[str, ...]) -> None:
        """The store calls `ops` will come (a store is timed): their series exist from now."""


NO_METRICS = NoMetrics()


class HubMetrics(NoMetrics):
    """The plugin's metrics in a registry of its own. `sessions`, `satellites` and `in_flight`
    are read at each scrape; they run on the health server's thread and must not block."""

    def __init__(self, sessions: Callable[[], int], satellites: Callable[[], int],
                 in_flight: Callable[[], int]):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = CollectorRegistry()
        reg = self.registry
        self._turns = Counter("hivemind_chat_turns", "Turns ended, by outcome", ["outcome"],
                              registry=reg)
        self._by_outcome = {outcome: self._turns.labels(outcome) for outcome in OUTCOMES}
        self._first = Histogram("hivemind_chat_turn_first_sentence_seconds",
                                "From a turn's utterance to its first sentence sent",
                                buckets=FIRST_BUCKETS, registry=reg)
        self._whole = Histogram("hivemind_chat_turn_seconds",
                                "From a turn's utterance to its end sent", buckets=TURN_BUCKETS,
                                registry=reg)
        Gauge("hivemind_chat_turns_in_flight", "Turns queued or running",
              registry=reg).set_function(in_flight)
        Gauge("hivemind_chat_sessions", "Satellite sessions this hub follows",
              registry=reg).set_function(sessions)
        Gauge("hivemind_chat_satellites", "Satellite connections open",
              registry=reg).set_function(satellites)
        self._store = Histogram("hivemind_chat_store_seconds",
                                "Conversation store calls, by operation", ["op"],
                                buckets=STORE_BUCKETS, registry=reg)
        self._store_ops: Dict[str, Any] = {}      # op -> its series, made at its first call
        self._store_errors = Counter("hivemind_chat_store_errors",
                                     "Conversation store calls that found it unavailable",
                                     registry=reg)

    def first_sentence(self, seconds: float) -> None:
        self._first.observe(max(0.0, seconds))

    def turn_ended(self, outcome: str, seconds: float) -> None:
        self._by_outcome.get(outcome, self._by_outcome["failed"]).inc()
        self._whole.observe(max(0.0, seconds))

    def store_call(self, op: str, seconds: float, failed: bool) -> None:
        series = self._store_ops.get(op)
        if series is None:
            series = self._series(op)
        series.observe(seconds)
        if failed:
            self._store_errors.inc()

    def store_ops_expected(self, ops: Tuple[str, ...]) -> None:
        for op in ops:
            self._series(op)

    def _series(self, op: str) -> Any:
        """`op`'s series, made at its first use (labels() returns one series for one op, from
        whichever thread asks first)."""
        return self._store_ops.setdefault(op, self._store.labels(op))

    def exposition(self, accept: str = "") -> Tuple[bytes, str]:
        """The registry in the text format the scraper's Accept header asks for (Prometheus
        text, or OpenMetrics), and its content type."""
        from prometheus_client.exposition import choose_encoder
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


def connections(clients: Callable[[], Dict[str, Any]]) -> Callable[[], int]:
    """How many connections hivemind-core's table `clients()` holds (4.0 may file one
    connection under several names)."""
    def count() -> int:
        for _ in range(3):     # the IO loop may change the table while it is copied
            try:
                return len({id(c) for c in list(clients().values())})
            except RuntimeError:
                continue
        return 0
    return count


class TimedStore:
    """A ConversationStore whose calls are timed and whose failures are counted; every other
    attribute is the wrapped store's."""

    def __init__(self, store: Any, metrics: NoMetrics, clock: Callable[[], float] =
                 time.perf_counter):
        self._inner = store
        self._metrics = metrics
        self._clock = clock
        self._secret: Optional[bytes] = None
        metrics.store_ops_expected(EVERY_TURN)

    def _timed(self, op: str, method: Callable[..., Any], *args: Any,
               since: Optional[float] = None, **kwargs: Any) -> Any:
        """`method`'s call timed, from `since` if given (a round trip written earlier)."""
        started, failed = (self._clock() if since is None else since), False
        try:
            return method(*args, **kwargs)
        except ConversationStoreError:
            failed = True
            raise
        finally:
            self._metrics.store_call(op, self._clock() - started, failed)

    def begin(self, session_id: str, turn_id: str, client: str = "",
              sent: Optional[Any] = None) -> Any:
        """Timed from `send_begin`'s write when it was sent early: the round trip's time."""
        return self._timed("begin", self._inner.begin, session_id, turn_id, client=client,
                           sent=sent, since=sent.started if sent is not None else None)

    def send_begin(self, session_id: str, turn_id: str, client: str = "") -> Optional[Any]:
        started = self._clock()
        sent = self._inner.send_begin(session_id, turn_id, client=client)
        if sent is not None:
            sent.started = started
        return sent

    def unclaim(self, *args: Any, **kwargs: Any) -> None:
        self._timed("unclaim", self._inner.unclaim, *args, **kwargs)

    def finish(self, *args: Any, **kwargs: Any) -> None:
        self._timed("finish", self._inner.finish, *args, **kwargs)

    def history(self, session_id: str) -> List[Any]:
        return self._timed("history", self._inner.history, session_id)

    def record(self, *args: Any, **kwargs: Any) -> None:
        self._timed("record", self._inner.record, *args, **kwargs)

    def keep_session(self, *args: Any, **kwargs: Any) -> None:
        self._timed("keep_session", self._inner.keep_session, *args, **kwargs)

    def secret(self) -> bytes:
        """Timed at its first read only: both stores keep the secret once read, and the hub
        asks for it at every message (identify), which would time a cached value each time
        (bench_metrics: the wrapper cost 2 % of a turn's CPU with every call timed)."""
        if self._secret is None:
            self._secret = self._timed("secret", self._inner.secret)
        return self._secret

    def claim_turn(self, *args: Any, **kwargs: Any) -> Optional[Any]:
        return self._timed("claim_turn", self._inner.claim_turn, *args, **kwargs)

    def take_over(self, session_id: str, turn_id: str) -> bool:
        return self._timed("take_over", self._inner.take_over, session_id, turn_id)

    def turn_record(self, session_id: str, turn_id: str) -> Optional[Any]:
        return self._timed("turn_record", self._inner.turn_record, session_id, turn_id)

    def ping(self) -> bool:
        started = self._clock()
        answered = self._inner.ping()
        self._metrics.store_call("ping", self._clock() - started, not answered)
        return answered

    def forget(self, session_id: str) -> None:
        self._inner.forget(session_id)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
