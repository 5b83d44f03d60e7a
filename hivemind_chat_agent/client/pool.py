"""The agent's connections: opened on first use, reused, closed when idle, bounded.

How many depends on the hub, learnt from the first connection's handshake (never by probing
with an utterance): a 4.x hub binds one Session to a connection, so each session_id gets its
own (LRU-bounded by `max_connections`); a hub that reads each message's Session (5.x) carries
every session_id of the agent over at most `shared_connections` connections, so a new
conversation pays no handshake: it joins the least busy one, and a session stays on the
connection it last used (where the hub sends its speech between turns). Another connection is
opened only while every open one has `TURNS_PER_SHARED` turns in flight. Should such a hub answer
a session under another id, the pool falls back to a connection per session.

On a 4.x hub, `spare_connections` handshaken connections wait for new sessions (spares.py).

Closing a connection loses nothing: a conversation's state is its Session in SessionManager,
which the next connection sends in its HELLO and with every utterance.
"""
import threading
import time
from collections import OrderedDict
from contextlib import nullcontext
from typing import Callable, Dict, List, Optional, Set

from ovos_bus_client.session import Session
from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.client.abandonment import Abandonment
from hivemind_chat_agent.client.churn_gate import ChurnGate
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import CLOSE_ACKNOWLEDGED_WITHIN, HubConnection
from hivemind_chat_agent.client.spares import Spares
from hivemind_chat_agent.errors import (
    AgentClosedError,
    HandshakeTimeoutError,
    HiveMindChatError,
    HubUnreachableError,
)

TURNS_PER_SHARED = 16   # turns in flight on a shared connection before another is opened
WARM_CONFIRM = 0.5      # seconds a warm-up waits for a 5.x hub's refusal of our pinned key


class ConnectionPool:
    def __init__(self, config: ClientConfig,
                 factory: Callable[[ClientConfig, Optional[Session]], HubConnection] =
                 HubConnection,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._factory = factory
        self._preferred = 0      # the hub of `config.hubs` that answered last
        self._clock = clock
        self._lock = threading.Lock()
        self._conns: "OrderedDict[str, HubConnection]" = OrderedDict()   # one per session
        self._shared: List[HubConnection] = []        # where the hub lets sessions share
        self._sticky: "OrderedDict[str, HubConnection]" = OrderedDict()  # session -> its last
        # unknown until the first handshake shows what the hub does, unless sharing is off
        self._sharing: Optional[bool] = None if config.share_connections else False
        self._first = threading.Lock()                # one connection learns it, not 64
        self._opening = threading.Lock()              # shared connections open one at a time
        self._pinned: Dict[str, int] = {}   # sessions whose idle connection must stay open
        self._connecting: Set[HubConnection] = set()
        self._closed = False
        self._warmed = False
        self._stop = threading.Event()
        self._reaper: Optional[threading.Thread] = None
        self.gate = ChurnGate(config.churn_guard,    # turns hold `gate.turn()`
                              stagger=0.025 if config.churn_guard > 0 else 0.0,
                              changes_last=config.connect_timeout + CLOSE_ACKNOWLEDGED_WITHIN,
                              max_in_flight=4 if config.churn_guard > 0 else 0)
        self.spares = Spares(config.spare_connections, self._open_spare, self._busy)

    def acquire(self, session: Session,
                abandonment: Optional[Abandonment] = None) -> HubConnection:
        """The live connection for this session, connecting if needed, leased to the caller until
        `release()` (callers serialize per session, so two connects for one session never
        race). A connect for a caller that gave up (`abandonment`) is dropped or aborted."""
        if self._sharing is None:
            with self._first:
                if self._sharing is None:
                    return self._open(session, self._place_first, abandonment)
        if self._sharing:
            conn = self._acquire_shared(session)
            if conn is not None:
                return conn
        return self._acquire_own(session, abandonment)

    def warm(self) -> None:
        """Connect before the first turn: a wrong key or a dead hub raises now, the pool learns
        what the hub does, and on a hub that binds a session per connection the spares fill."""
        with self._first:
            if not self._warmed:
                self._warm_once()
                self._warmed = True
        if self._sharing is False:
            self.spares.refill_soon()

    def _warm_once(self) -> None:
        if self._sharing:                # a turn has connected to a sharing hub already
            return
        conn = self._connect(None)
        shared = self._sharing is None and conn.many_sessions   # the first, on a 5.x hub
        try:
            if shared:
                conn.claim(Session(conn.useragent))   # it carries every session: a name
            conn.confirm(WARM_CONFIRM)
        except HiveMindChatError:
            conn.close()
            raise
        if shared:
            self._file(conn, conn.session_id, self._place_first, lease=False)
            return
        with self._lock:
            if self._sharing is None:
                self._sharing = False
        if not self.spares.add(conn):
            self._close([conn])          # no spares wanted: it only proved the way in

    def _acquire_shared(self, session: Session) -> Optional[HubConnection]:
        """A shared connection for this session, or None once the hub showed it cannot share."""
        sid = session.session_id
        while True:
            with self._lock:
                self._check_open()
                stale = self._drop_unusable()
                if not self._sharing:
                    break
                conn = self._sticky.get(sid)
                if conn is None or conn not in self._shared:
                    busy = self._opening.locked() or \
                        len(self._shared) >= self.config.shared_connections
                    conn = min(self._shared, key=lambda c: c.leases, default=None)
                    if conn is not None and conn.leases >= TURNS_PER_SHARED and not busy:
                        conn = None          # all are busy and there is room: open another
                if conn is not None:
                    self._stick(sid, conn)
                    conn.leases += 1
                    self._close_later(stale)
                    return conn
            self._close_later(stale)
            with self._opening:
                with self._lock:
                    if len(self._shared) >= self.config.shared_connections or \
                            any(c.leases < TURNS_PER_SHARED for c in self._shared):
                        continue             # another thread opened one meanwhile
                return self._open(session, self._place_shared)
        self._close_later(stale)
        return None

    def _place_first(self, conn: HubConnection, sid: str) -> List[HubConnection]:
        """The first connection's handshake tells whether this hub lets sessions share."""
        self._sharing = conn.many_sessions
        if not self._sharing:
            self.spares.refill_soon()
        return (self._place_shared if self._sharing else self._place_own)(conn, sid)

    def _place_shared(self, conn: HubConnection, sid: str) -> List[HubConnection]:
        self._shared.append(conn)
        self._stick(sid, conn)
        return []

    def _place_own(self, conn: HubConnection, sid: str) -> List[HubConnection]:
        self._conns[sid] = conn
        return self._evict_over_bound(keep=sid)

    def _drop_unusable(self) -> List[HubConnection]:
        """Take dead and retired connections out of the shared set (caller holds the lock); a
        connection that saw the hub mix up sessions ends sharing for good."""
        if any(not c.many_sessions for c in self._shared):
            self._sharing = False
        keep = [c for c in self._shared if self._sharing and c.alive and not c.retired]
        gone = [c for c in self._shared if c not in keep]
        self._shared = keep
        for conn in gone:
            conn.retired = True
        return gone

    def _stick(self, sid: str, conn: HubConnection) -> None:
        self._sticky[sid] = conn
        self._sticky.move_to_end(sid)
        while len(self._sticky) > self.config.max_sessions:
            self._sticky.popitem(last=False)

    def _close_later(self, conns: List[HubConnection]) -> None:
        """Close retired connections that no turn holds; the others close with their last turn."""
        idle = [c for c in conns if c.leases == 0]
        if idle:
            background.start(threading.Thread(target=self._close, args=(idle,), daemon=True,
                                              name="hivemind-chat-retire"))

    def _open(self, session: Session,
              place: Callable[[HubConnection, str], List[HubConnection]],
              abandonment: Optional[Abandonment] = None) -> HubConnection:
        """Connect, then file the connection with `place` and lease it."""
        return self._file(self._connect(session, abandonment), session.session_id, place)

    def _connect(self, session: Optional[Session],
                 abandonment: Optional[Abandonment] = None) -> HubConnection:
        """A connected connection (None: a spare), apart from this agent's turns in flight.
        With several hubs in `host`: the one that answered last first, then the others in
        their order; a hub that cannot be reached (or does not finish its handshake) passes
        the connect on, any other refusal (key, password, pin) is raised at once."""
        hubs = len(self.config.hubs) or 1
        order = [self._preferred] + [i for i in range(hubs) if i != self._preferred]
        for attempt, index in enumerate(order):
            try:
                conn = self._connect_to(self.config.with_hub(index), session, abandonment)
            except (HubUnreachableError, HandshakeTimeoutError) as e:
                if attempt == len(order) - 1:
                    raise
                LOG.info(f"hub {index + 1} of {hubs} did not answer ({e}); trying the next")
                continue
            self._preferred = index
            return conn
        raise AssertionError("unreachable")

    def _connect_to(self, config: ClientConfig, session: Optional[Session],
                    abandonment: Optional[Abandonment] = None) -> HubConnection:
        with self.gate.change():
            if abandonment is not None:
                abandonment.check()             # gave up while waiting for the gate
            conn = self._factory(config, session)
            conn.acknowledge_changes = self.gate.max_wait > 0   # not relaxed (churn_gate.py)
            with self._lock:
                self._check_open()
                self._connecting.add(conn)      # so close_all() can end the connect at once
            try:
                with abandonment.connecting(conn) if abandonment is not None else nullcontext():
                    conn.connect()
            finally:
                with self._lock:
                    self._connecting.discard(conn)
        return conn

    def _file(self, conn: HubConnection, sid: str,
              place: Callable[[HubConnection, str], List[HubConnection]],
              lease: bool = True) -> HubConnection:
        """File the connection with `place` and lease it, under the lock, unless the pool was
        shut down meanwhile; `place` returns connections to close."""
        with self._lock:
            if self._closed:
                conn.close()
                self._check_open()
            evicted = place(conn, sid)
            conn.leases += int(lease)
            self._start_reaper()
        self._close(evicted)
        return conn

    def _open_spare(self) -> HubConnection:
        return self._connect(None)

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._connecting) or any(c.leases for c in self._conns.values())

    def _claim_spare(self, session: Session) -> Optional[HubConnection]:
        """A spare made this session's own connection (its HELLO kept apart from turns in
        flight, like a connect), or None when there is none."""
        while True:
            conn = self.spares.take()
            if conn is None:
                self.spares.refill_soon()    # all taken or dead (a hub restart): start again
                return None
            try:
                with self.gate.change():
                    conn.claim(session)
            except HiveMindChatError:
                conn.close()
                continue
            self._file(conn, session.session_id, self._place_own)   # leased: no refill yet
            self.spares.refill_soon()
            return conn

    def _acquire_own(self, session: Session,
                     abandonment: Optional[Abandonment] = None) -> HubConnection:
        sid = session.session_id
        with self._lock:
            self._check_open()
            conn = self._conns.get(sid)
            if conn is not None:
                if conn.alive:
                    self._conns.move_to_end(sid)
                    conn.leases += 1
                    return conn
                del self._conns[sid]
        if conn is not None:
            self._close([conn])
        return self._claim_spare(session) or self._open(session, self._place_own, abandonment)

    def release(self, conn: HubConnection) -> None:
        """The caller's turn is over; the connection may be evicted or reaped again."""
        with self._lock:
            conn.leases -= 1
            conn.last_used = self._clock()
            done = conn.retired and conn.leases == 0
        if done:
            self._close([conn])

    def peek(self, session_id: str) -> Optional[HubConnection]:
        """The session's open connection, if any, without leasing it."""
        with self._lock:
            if self._sharing:
                conn = self._sticky.get(session_id)
                return conn if conn in self._shared else None
            return self._conns.get(session_id)

    def pin(self, session_id: str) -> None:
        """Keep this session's connection open while idle (someone listens for its speech)."""
        with self._lock:
            self._pinned[session_id] = self._pinned.get(session_id, 0) + 1

    def unpin(self, session_id: str) -> None:
        with self._lock:
            left = self._pinned.get(session_id, 0) - 1
            if left > 0:
                self._pinned[session_id] = left
            else:
                self._pinned.pop(session_id, None)

    def discard(self, session_id: str) -> None:
        """Drop a connection whose stream can no longer be trusted (lost, timed out, abandoned)."""
        with self._lock:
            conn = self._conns.pop(session_id, None)
            if conn is None and self._sharing:    # other sessions' turns may be on it
                conn = self._sticky.pop(session_id, None)
                if conn is not None and conn in self._shared:
                    self._shared.remove(conn)
                    conn.retired = True
                    if conn.leases:
                        return                    # closed when its last turn ends
                else:
                    conn = None
        if conn is not None:
            self._close([conn])

    def reap_idle(self) -> int:
        now = self._clock()
        with self._lock:
            idle = [sid for sid, c in self._conns.items()
                    if not c.leases and (not c.alive or (
                        now - c.last_used >= self.config.idle_timeout
                        and sid not in self._pinned))]
            conns = [self._conns.pop(sid) for sid in idle]
            conns += self._evict_over_bound(keep=None)
            listened = {id(self._sticky.get(sid)) for sid in self._pinned}
            idle_shared = [c for c in self._shared
                           if not c.leases and (not c.alive or (
                               now - c.last_used >= self.config.idle_timeout
                               and id(c) not in listened))]
            self._shared = [c for c in self._shared if c not in idle_shared]
            conns += idle_shared
        self._close(conns)
        return len(conns)

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._conns.values()) + self._shared
            self._conns.clear()
            self._shared, self._sticky = [], OrderedDict()
            connecting = list(self._connecting)
            reaper, self._reaper = self._reaper, None
        for conn in connecting:
            conn.abort_connect(AgentClosedError("the agent was shut down while connecting"))
        self._stop.set()
        self.spares.close()
        for conn in conns:
            conn.close()
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join(timeout=5)

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns) + len(self._shared)

    def _close(self, conns: List[HubConnection]) -> None:
        """Close connections while none of this agent's turns is in flight (ChurnGate)."""
        if conns:
            with self.gate.change():
                for conn in conns:
                    conn.close()

    def _check_open(self):
        if self._closed:
            raise AgentClosedError("this agent was shut down; create a new one to chat again")

    def _evict_over_bound(self, keep: Optional[str]) -> List[HubConnection]:
        evicted = []
        for sid in list(self._conns):
            if len(self._conns) <= self.config.max_connections:
                break
            conn = self._conns[sid]
            if sid != keep and not conn.leases and sid not in self._pinned:
                evicted.append(self._conns.pop(sid))
        if len(self._conns) > self.config.max_connections:
            LOG.debug(f"{len(self._conns)} connections are busy, over max_connections="
                      f"{self.config.max_connections}; idle ones are closed as turns end")
        return evicted

    def _start_reaper(self):
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap_loop, daemon=True,
                                            name="hivemind-chat-reaper")
            background.start(self._reaper)

    def _reap_loop(self):
        interval = max(0.05, min(self.config.idle_timeout / 2, 30.0))
        while not self._stop.wait(interval):
            try:
                self.reap_idle()
            except Exception as e:
                LOG.debug(f"idle reaper: {type(e).__name__}: {e}")
