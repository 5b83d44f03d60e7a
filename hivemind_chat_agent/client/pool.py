"""The agent's connections: opened on first use, reused, closed when idle, bounded.

How they map to sessions depends on the hub, learnt from the first connection's handshake
(never by probing with an utterance) and chosen then, once, as a policy of its own: a 4.x hub
binds one Session to a connection, so each session_id gets its own (client/pool_own.py, with
the spares of client/spares.py); a hub that reads each message's Session (5.x) carries every
session_id of the agent over at most `shared_connections` connections (client/pool_shared.py).
Should such a hub answer a session under another id, the pool falls back to a connection per
session. With `share_connections` off the pool gives each session its own from the start.

The pool owns its leases (client/pool_parts.py's `Leases`: which turns hold a connection, since
when it is idle, whether it is retired), the pins (sessions someone listens to), the idle
reaper and the shutdown.

Closing a connection loses nothing: a conversation's state is its Session in SessionManager,
which the next connection sends in its HELLO and with every utterance.
"""
import threading
from collections import OrderedDict
from typing import List, Optional

from ovos_bus_client.session import Session
from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.client.abandonment import Abandonment
from hivemind_chat_agent.client.churn_gate import ChurnGate
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import CLOSE_ACKNOWLEDGED_WITHIN, HubConnection
from hivemind_chat_agent.client.observer import NO_OBSERVER, ClientObserver
from hivemind_chat_agent.client.pool_own import OwnConnections
from hivemind_chat_agent.client.pool_parts import (
    ConnectionFactory,
    Connector,
    PoolParts,
    PoolPolicy,
)
from hivemind_chat_agent.client.pool_shared import SharedConnections
from hivemind_chat_agent.client.spares import Spares
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.errors import AgentClosedError, HiveMindChatError

WARM_CONFIRM = 0.5      # seconds a warm-up waits for a 5.x hub's refusal of our pinned key
BROKEN_KEPT = 1024      # broken connections remembered, to count each one's replacement once


class ConnectionPool:
    """What the agent and its turns use: `acquire` (leased until `release`), `warm`, `peek`,
    `pin`/`unpin`, `discard`, `reap_idle`, `close_all`, `len()`. Safe from any thread."""

    def __init__(self, config: ClientConfig, factory: ConnectionFactory,
                 clock: Clock = background.SYSTEM_CLOCK):
        """`factory(config, session)` makes an unconnected HubConnection (None: a spare)."""
        self.config = config
        self._lock = threading.Lock()
        self.gate = ChurnGate(config.churn_guard,    # turns hold `gate.turn()`
                              stagger=0.025 if config.churn_guard > 0 else 0.0,
                              changes_last=config.connect_timeout + CLOSE_ACKNOWLEDGED_WITHIN,
                              turns_last=config.timeout,
                              max_in_flight=4 if config.churn_guard > 0 else 0)
        self._connector = Connector(config, factory, self.gate, self._lock,
                                    after_connect=self._tell_spares_if_quiet)
        self._parts = PoolParts(config, self._connector, self._lock, clock)
        self.spares = Spares(config.spare_connections, lambda: self._connector.open(None),
                             self._busy)
        # chosen at the first handshake, unless sharing is off
        self._policy: Optional[PoolPolicy] = \
            None if config.share_connections else self._own()
        self._first = threading.Lock()                # one connection learns it, not 64
        self._warmed = False
        self._stop = threading.Event()
        self._reaper: Optional[threading.Thread] = None
        self.observer: ClientObserver = NO_OBSERVER     # told of each reconnect
        # session -> id of its connection that broke (lost mid-turn, or left draining), and
        # the broken connections already replaced (a shared one is replaced once, for all)
        self._broken: "OrderedDict[str, int]" = OrderedDict()
        self._replaced: "OrderedDict[int, None]" = OrderedDict()

    @property
    def sharing(self) -> Optional[bool]:
        """Whether sessions share connections here; None until the first handshake."""
        policy = self._policy
        return None if policy is None else policy.shares_connections

    @property
    def connections_opened(self) -> int:
        """Connections made so far (spares included): how much the pool churns."""
        return self._connector.opened

    def acquire(self, session: Session,
                abandonment: Optional[Abandonment] = None) -> HubConnection:
        """The live connection for this session, connecting if needed, leased to the caller until
        `release()` (callers serialize per session, so two connects for one session never
        race). A connect for a caller that gave up (`abandonment`) is dropped or aborted.
        One that replaces the session's broken connection is a reconnect (`observer`)."""
        sid = session.session_id
        broken = self._broken_for(sid)
        try:
            conn = self._acquire(session, abandonment)
        except BaseException:
            if broken is not None:
                with self._lock:
                    self._broken[sid] = broken     # the next attempt replaces it
            raise
        if broken is not None and id(conn) != broken and self._first_replacement(broken):
            self.observer.reconnected()
        return conn

    def broke(self, session_id: str, conn: HubConnection) -> None:
        """The session's connection broke (or was left, its replica draining): the connection
        its next turn gets is a reconnect."""
        with self._lock:
            self._broken[session_id] = id(conn)
            self._broken.move_to_end(session_id)
            while len(self._broken) > BROKEN_KEPT:
                self._broken.popitem(last=False)

    def _broken_for(self, sid: str) -> Optional[int]:
        """The session's broken connection: reported, or filed and found dead."""
        with self._lock:
            broken = self._broken.pop(sid, None)
            if broken is None and self._policy is not None:
                old = self._policy.peek(sid)
                if old is not None and not old.alive:
                    broken = id(old)
            return broken

    def _first_replacement(self, broken: int) -> bool:
        with self._lock:
            if broken in self._replaced:
                return False
            self._replaced[broken] = None
            while len(self._replaced) > BROKEN_KEPT:
                self._replaced.popitem(last=False)
            return True

    def _acquire(self, session: Session,
                 abandonment: Optional[Abandonment] = None) -> HubConnection:
        conn = None
        if self._policy is None:
            with self._first:
                if self._policy is None:
                    conn = self._open_first(session, abandonment)
        while conn is None:
            policy = self._policy
            assert policy is not None, "chosen by the first connection, or opened above"
            conn = policy.acquire(session, abandonment)
            if conn is None:
                self._fall_back(policy)
        self._start_reaper()
        return conn

    def _open_first(self, session: Session,
                    abandonment: Optional[Abandonment]) -> HubConnection:
        conn = self._parts.file(self._connector.open(session, abandonment),
                                session.session_id, self._place_first)
        if not self.sharing:
            self.spares.refill_soon()
        return conn

    def _place_first(self, conn: HubConnection, sid: str) -> List[HubConnection]:
        """Lock held: the first connection's handshake tells whether this hub lets sessions
        share; file it with the policy that follows."""
        self._policy = SharedConnections(self._parts) if conn.many_sessions else self._own()
        return self._policy.place(conn, sid)

    def _own(self) -> OwnConnections:
        return OwnConnections(self._parts, self.spares)

    def _fall_back(self, shared: PoolPolicy) -> None:
        """The hub answered a session under another id: a connection per session from now."""
        with self._lock:
            if self._policy is shared:
                LOG.info("the hub mixed up sessions on a shared connection; "
                         "a connection per session from now on")
                self._policy = self._own()

    def warm(self) -> None:
        """Connect before the first turn: a wrong key or a dead hub raises now, the pool learns
        what the hub does, and on a hub that binds a session per connection the spares fill."""
        with self._first:
            if not self._warmed:
                self._warm_once()
                self._warmed = True
        if self.sharing is False:
            self.spares.refill_soon()

    def _warm_once(self) -> None:
        if self.sharing:                 # a turn has connected to a sharing hub already
            return
        conn = self._connector.open(None)
        shared = self._policy is None and conn.many_sessions   # the first, on a 5.x hub
        try:
            if shared:
                conn.claim(Session(conn.useragent))   # it carries every session: a name
            conn.confirm(WARM_CONFIRM)
        except HiveMindChatError:
            conn.close()
            raise
        if shared:
            self._parts.file(conn, conn.session_id, self._place_first, lease=False)
            self._start_reaper()
            return
        with self._lock:
            if self._policy is None:
                self._policy = self._own()
        if not self.spares.add(conn):
            self._connector.close([conn])   # no spares wanted: it only proved the way in

    def release(self, conn: HubConnection) -> None:
        """The caller's turn is over; the connection may be evicted or reaped again."""
        with self._lock:
            done = self._parts.leases.give_back(conn, self._parts.clock.now())
            quiet = not self._busy_locked()
        if done:
            self._connector.close([conn])   # retired, and its last turn just ended
        if quiet:
            self.spares.quiet()

    def peek(self, session_id: str) -> Optional[HubConnection]:
        """The session's open connection, if any, without leasing it."""
        with self._lock:
            return self._policy.peek(session_id) if self._policy is not None else None

    def pin(self, session_id: str) -> None:
        """Keep this session's connection open while idle (someone listens for its speech)."""
        pins = self._parts.pins
        with self._lock:
            pins[session_id] = pins.get(session_id, 0) + 1

    def unpin(self, session_id: str) -> None:
        pins = self._parts.pins
        with self._lock:
            left = pins.get(session_id, 0) - 1
            if left > 0:
                pins[session_id] = left
            else:
                pins.pop(session_id, None)

    def hub_draining(self, conn: HubConnection) -> None:
        """`conn`'s hub refused a turn because it is shutting down: the next connection goes
        to another hub of a `host` list (behind a load balancer, the balancer picks)."""
        with self._lock:
            self._connector.draining(conn.config)

    def discard(self, session_id: str) -> None:
        """Drop a connection whose stream can no longer be trusted (lost, timed out, abandoned);
        a shared one closes once the other sessions' turns on it have ended."""
        with self._lock:
            conns = self._policy.discard(session_id) if self._policy is not None else []
        self._connector.close(conns)

    def reap_idle(self) -> int:
        """Close connections idle for `idle_timeout` (or dead) that no turn holds and nobody
        listens to, and any over `max_connections`; how many were closed."""
        now = self._parts.clock.now()
        with self._lock:
            conns = self._policy.reap(now) if self._policy is not None else []
        self._connector.close(conns)
        return len(conns)

    def close_all(self) -> None:
        """Shut down: every connection closes (turns on them end as lost), connects in
        progress are aborted, and every later `acquire` raises AgentClosedError."""
        with self._lock:
            connecting = self._connector.shut()
            conns = self._parts.leases.clear()
            if self._policy is not None:
                self._policy.clear()
            reaper, self._reaper = self._reaper, None
            self._stop.set()
        for conn in connecting:
            conn.abort_connect(AgentClosedError("the agent was shut down while connecting"))
        self.spares.close()
        for conn in conns:
            conn.close()
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join(timeout=5)

    def __len__(self) -> int:
        with self._lock:
            return len(self._policy) if self._policy is not None else 0

    def _busy(self) -> bool:
        with self._lock:
            return self._busy_locked()

    def _busy_locked(self) -> bool:
        """Some turn holds a connection or a connect is in progress (spares wait for neither)."""
        return self._connector.connecting or self._parts.leases.held > 0

    def _tell_spares_if_quiet(self) -> None:
        if not self._busy():
            self.spares.quiet()

    def _start_reaper(self) -> None:
        if self._reaper is not None:
            return
        with self._lock:
            if self._reaper is not None or self._stop.is_set():
                return
            reaper = self._reaper = threading.Thread(target=self._reap_loop, daemon=True,
                                                     name="hivemind-chat-reaper")
        background.start(reaper)

    def _reap_loop(self) -> None:
        interval = max(0.05, min(self.config.idle_timeout / 2, 30.0))
        while not self._stop.wait(interval):
            try:
                self.reap_idle()
            except Exception as e:
                LOG.debug(f"idle reaper: {type(e).__name__}: {e}")
