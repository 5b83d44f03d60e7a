"""The fronts' Prometheus metrics (docs/metrics.md: the names and labels are a contract): the
hub plugin's turn metrics, seen from `hivemind-chat openai`, `a2a`, `mcp --http` and `wyoming`,
with a `front` label, plus the requests a front answered by status and its agent's reconnects
and resends.

`FrontMetrics(front)` is the agent's observer (client/observer.ClientObserver: the client core
tells it of each turn's start, first sentence and end, each reconnect and resend, and never
imports prometheus_client) and the front's request counter, in a CollectorRegistry of its own.
The turn metrics share the hub's names and buckets (hub/metrics.py), so one dashboard reads a
hub and its fronts; the outcome label comes from core/health.front_outcome.

Off unless asked (`--metrics`): `metrics_for(front, wanted)` is then None and a front neither
imports prometheus_client nor counts anything; asked without the `[metrics]` extra, it is a
MissingExtraError naming the extra.

Where the metrics are read: an HTTP front serves `GET /metrics` itself, behind its guard
(bridges/http_front.GuardedApp: Host, Origin and, with keys, the Bearer key, as every other
path); Wyoming, which is not HTTP, on a port of its own (`serve_on`: the hub plugin's
health server, hub/health_server.py, with its allow list and Host check).
"""
import threading
from typing import Optional, Tuple

from hivemind_chat_agent.client.observer import RESEND_REASONS, ClientObserver
from hivemind_chat_agent.core.health import OUTCOMES, front_outcome
from hivemind_chat_agent.core.outcomes import TurnStatus

FRONTS = ("openai", "a2a", "mcp", "wyoming")
# Wyoming's exchanges (bridges/wyoming_connection.py), its `status` label
WYOMING_STATUSES = ("info", "handled", "not_handled", "busy", "hung_up", "bad_event",
                    "deadline", "refused")


class FrontMetrics(ClientObserver):
    """One front's metrics; `registry` is what /metrics exposes. Safe from any thread."""

    def __init__(self, front: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        from hivemind_chat_agent.hub.metrics import FIRST_BUCKETS, TURN_BUCKETS
        if front not in FRONTS:
            raise ValueError(f"front must be one of {', '.join(FRONTS)}, not {front!r}")
        self.front = front
        self.registry = reg = CollectorRegistry()
        turns = Counter("hivemind_chat_turns", "Turns ended, by outcome", ["front", "outcome"],
                        registry=reg)
        self._by_outcome = {outcome: turns.labels(front, outcome) for outcome in OUTCOMES}
        self._first = Histogram("hivemind_chat_turn_first_sentence_seconds",
                                "From a turn's start to its first sentence", ["front"],
                                buckets=FIRST_BUCKETS, registry=reg).labels(front)
        self._whole = Histogram("hivemind_chat_turn_seconds", "From a turn's start to its end",
                                ["front"], buckets=TURN_BUCKETS, registry=reg).labels(front)
        self._in_flight = Gauge("hivemind_chat_turns_in_flight", "Turns begun and not ended",
                                ["front"], registry=reg).labels(front)
        self._requests = Counter("hivemind_chat_front_requests",
                                 "Requests answered, by HTTP status (Wyoming: by exchange)",
                                 ["front", "status"], registry=reg)
        self._statuses = {}
        if front == "wyoming":
            self._statuses = {s: self._requests.labels(front, s) for s in WYOMING_STATUSES}
        self._reconnects = Counter("hivemind_chat_client_reconnects",
                                   "Connections to the hub opened in place of one that broke",
                                   ["front"], registry=reg).labels(front)
        resends = Counter("hivemind_chat_client_resends", "Turns sent to the hub again",
                          ["front", "reason"], registry=reg)
        self._resends = {reason: resends.labels(front, reason) for reason in RESEND_REASONS}
        self._lock = threading.Lock()

    # ---- the agent's observer ----
    def turn_began(self) -> None:
        self._in_flight.inc()

    def first_sentence(self, seconds: float) -> None:
        self._first.observe(max(0.0, seconds))

    def turn_ended(self, status: Optional[TurnStatus], seconds: float) -> None:
        self._by_outcome[front_outcome(status)].inc()
        self._whole.observe(max(0.0, seconds))
        self._in_flight.dec()

    def reconnected(self) -> None:
        self._reconnects.inc()

    def resent(self, reason: str) -> None:
        counter = self._resends.get(reason)
        if counter is not None:
            counter.inc()

    # ---- the front's requests ----
    def request(self, status: object) -> None:
        """One request answered with `status` (an HTTP status, or one of WYOMING_STATUSES)."""
        key = str(status)
        counter = self._statuses.get(key)
        if counter is None:
            with self._lock:
                counter = self._statuses.get(key)
                if counter is None:
                    if len(self._statuses) >= 64:      # HTTP statuses are few: a bound anyway
                        key = "other"
                    counter = self._statuses[key] = self._requests.labels(self.front, key)
        counter.inc()

    def exposition(self, accept: str = "") -> Tuple[bytes, str]:
        """The registry in the format the scraper's Accept asks for, and its content type."""
        from prometheus_client.exposition import choose_encoder
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


def metrics_for(front: str, wanted: bool) -> Optional[FrontMetrics]:
    """The front's metrics when `wanted` (its --metrics), else None; MissingExtraError naming
    the [metrics] extra when wanted without it."""
    if not wanted:
        return None
    from hivemind_chat_agent.extras import require
    require("metrics", f"--metrics of hivemind-chat {front}")
    return FrontMetrics(front)


def serve_on(metrics: FrontMetrics, address: str, allow_from, front: str):
    """/metrics (with /healthz, and /readyz always ready) on `address` ("HOST:PORT") on a
    thread of its own: hub/health_server.HealthServer, closed by default as the hub's
    `health` endpoint (loopback peers; beyond loopback only `allow_from`, refused at start
    otherwise). Started; stop() it. ConfigurationError for a bad address or allow list."""
    from hivemind_chat_agent.core.health import Verdict, parse_address
    from hivemind_chat_agent.core.peer_gate import AllowList
    from hivemind_chat_agent.errors import ConfigurationError
    from hivemind_chat_agent.hub.health_server import HealthServer
    try:
        host, port = parse_address(address)
    except ValueError:
        raise ConfigurationError(f"--metrics must be HOST:PORT (e.g. 127.0.0.1:9108), not "
                                 f"{address!r}") from None
    allow = AllowList.for_bind(host, allow_from, f"the metrics endpoint of hivemind-chat "
                               f"{front}", f"--metrics {host}:{port} --metrics-allow-from "
                               "10.0.0.2", option="--metrics-allow-from")
    try:
        server = HealthServer(host, port, lambda: Verdict(200), metrics.exposition, allow)
    except OSError as e:
        raise ConfigurationError(f"cannot listen on {address} for --metrics: "
                                 f"{e.strerror or e}") from None
    return server.start()


__all__ = ["FrontMetrics", "metrics_for", "serve_on", "FRONTS", "WYOMING_STATUSES"]
