"""What the pool's two policies share: the lease table, the pins, and how connections are
opened, filed and closed.

`Leases` is the pool's own record of every connection it has filed (the connection knows
nothing of it): how many turns hold each one, when the last one gave it back (idle reaping),
and whether it is retired (no new turns; closed when its last turn ends). `Connector` opens a
connection over the configured hubs, through the churn gate (client/churn_gate.py), and
remembers the connects in progress so a shutdown can end them at once. The pool's one lock
guards all of it; methods that say "lock held" expect the caller to hold it.
"""
import threading
from contextlib import nullcontext
from typing import Callable, Dict, List, Optional, Protocol, Set

from ovos_bus_client.session import Session
from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.client.abandonment import Abandonment
from hivemind_chat_agent.client.churn_gate import ChurnGate
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.errors import (
    AgentClosedError,
    HandshakeTimeoutError,
    HubSessionDroppedError,
    HubUnreachableError,
)

SESSION_DROPPED_RETRIES = 2   # connects made again after the hub dropped a handshake (MQTT)
ConnectionFactory = Callable[[ClientConfig, Optional[Session]], HubConnection]
Place = Callable[[HubConnection, str], List[HubConnection]]   # lock held; returns to close


class PoolPolicy(Protocol):
    """How a pool maps sessions to connections: client/pool_own.py's `OwnConnections` (one per
    session, 4.x hubs) or client/pool_shared.py's `SharedConnections` (shared, 5.x hubs).
    The pool chooses one at the first handshake and turns to it for everything but the
    leases, the pins and the shutdown, which are its own."""

    shares_connections: bool

    def acquire(self, session: Session,
                abandonment: Optional[Abandonment] = None) -> Optional[HubConnection]:
        """The session's connection, leased; None only when this policy can no longer serve
        (a shared connection saw the hub mix up sessions): the pool falls back."""

    def place(self, conn: HubConnection, session_id: str) -> List[HubConnection]:
        """Lock held: file a connection just opened for `session_id`; returns the
        connections it displaced, to close."""

    def peek(self, session_id: str) -> Optional[HubConnection]:
        """Lock held: the session's open connection, if any."""

    def discard(self, session_id: str) -> List[HubConnection]:
        """Lock held: take the session's connection out of use; returns what to close now."""

    def reap(self, now: float) -> List[HubConnection]:
        """Lock held: take idle (and dead) connections out; returns them, to close."""

    def clear(self) -> None:
        """Lock held: forget every connection (the pool closes them)."""

    def __len__(self) -> int:
        """Lock held: how many connections it has open."""


class _Lease:
    __slots__ = ("holders", "last_used", "retired")

    def __init__(self, holders: int, now: float):
        self.holders, self.last_used, self.retired = holders, now, False


class Leases:
    """Every filed connection: turns holding it, when it was last given back, retired or not.
    A connection leaves the table when it leaves the pool. Lock held for every method."""

    def __init__(self) -> None:
        self._table: Dict[HubConnection, _Lease] = {}
        self.held = 0            # leases held over all connections

    def file(self, conn: HubConnection, now: float, lease: bool) -> None:
        self._table[conn] = _Lease(int(lease), now)
        self.held += int(lease)

    def take(self, conn: HubConnection) -> None:
        self._table[conn].holders += 1
        self.held += 1

    def give_back(self, conn: HubConnection, now: float) -> bool:
        """One turn is done with it; True when it is retired and free: it left, close it."""
        lease = self._table.get(conn)
        if lease is None:        # closed by a shutdown while the turn held it
            return False
        lease.holders -= 1
        self.held -= 1
        lease.last_used = now
        if lease.retired and not lease.holders:
            del self._table[conn]
            return True
        return False

    def holders(self, conn: HubConnection) -> int:
        lease = self._table.get(conn)
        return lease.holders if lease is not None else 0

    def idle_for(self, conn: HubConnection, now: float) -> float:
        return now - self._table[conn].last_used

    def retire(self, conn: HubConnection) -> bool:
        """No new turns for it; True when no turn holds it: it left, close it now (otherwise
        `give_back` says so when its last turn ends)."""
        lease = self._table.get(conn)
        if lease is None:
            return False
        lease.retired = True
        if lease.holders:
            return False
        del self._table[conn]
        return True

    def forget(self, conn: HubConnection) -> None:
        lease = self._table.pop(conn, None)
        if lease is not None:
            self.held -= lease.holders

    def clear(self) -> List[HubConnection]:
        conns, self._table, self.held = list(self._table), {}, 0
        return conns


class Connector:
    """Opens the pool's connections (over the hubs of `config.hubs`) and closes them, each
    while none of this agent's turns is in flight (ChurnGate)."""

    def __init__(self, config: ClientConfig, factory: ConnectionFactory, gate: ChurnGate,
                 lock: threading.Lock, after_connect: Callable[[], None] = lambda: None):
        self.config = config
        self._factory = factory
        self.gate = gate
        self._lock = lock
        self._after_connect = after_connect   # a connect ended (outside the lock)
        self._preferred = 0      # the hub of `config.hubs` that answered last
        self._connecting: Set[HubConnection] = set()
        self.closed = False
        self.opened = 0          # connections made, ever

    @property
    def connecting(self) -> bool:
        """Lock held: some connect is in progress."""
        return bool(self._connecting)

    def check_open(self) -> None:
        """Lock held: raise once the pool has been shut down."""
        if self.closed:
            raise AgentClosedError("this agent was shut down; create a new one to chat again")

    def open(self, session: Optional[Session],
             abandonment: Optional[Abandonment] = None) -> HubConnection:
        """A connected connection (None: a spare), apart from this agent's turns in flight.
        With several hubs in `host`: the one that answered last first, then the others in
        their order; a hub that cannot be reached (or does not finish its handshake) passes
        the connect on, any other refusal (key, password, pin) is raised at once."""
        hubs = len(self.config.hubs) or 1
        order = [self._preferred] + [i for i in range(hubs) if i != self._preferred]
        for attempt, index in enumerate(order):
            try:
                conn = self._open_once_more(self.config.with_hub(index), session, abandonment)
            except (HubUnreachableError, HandshakeTimeoutError) as e:
                if attempt == len(order) - 1:
                    raise
                LOG.info(f"hub {index + 1} of {hubs} did not answer ({e}); trying the next")
                continue
            self._preferred = index
            return conn
        raise AssertionError("unreachable")

    def draining(self, config: ClientConfig) -> None:
        """The hub at `config`'s address is draining (it refused a turn, shutting down): with
        several hubs in `host`, new connections try the next one first."""
        hubs = self.config.hubs
        where = (config.host, config.secure, config.port)
        if len(hubs) > 1 and hubs[self._preferred] == where:
            self._preferred = (self._preferred + 1) % len(hubs)

    def _open_once_more(self, config: ClientConfig, session: Optional[Session],
                        abandonment: Optional[Abandonment]) -> HubConnection:
        """`_open_at`, again (twice at most) if the hub dropped our session during the
        handshake (MQTT: a new session is a new HELLO away)."""
        for _ in range(SESSION_DROPPED_RETRIES):
            try:
                return self._open_at(config, session, abandonment)
            except HubSessionDroppedError as e:
                LOG.info(f"{e}; connecting again")
        return self._open_at(config, session, abandonment)

    def _open_at(self, config: ClientConfig, session: Optional[Session],
                 abandonment: Optional[Abandonment]) -> HubConnection:
        try:
            with self.gate.change():
                if abandonment is not None:
                    abandonment.check()             # gave up while waiting for the gate
                conn = self._factory(config, session)
                conn.acknowledge_changes = self.gate.max_wait > 0   # not relaxed
                with self._lock:
                    self.opened += 1
                    self.check_open()
                    self._connecting.add(conn)      # so shut() can end the connect at once
                try:
                    with abandonment.connecting(conn) if abandonment is not None \
                            else nullcontext():
                        conn.connect()
                finally:
                    with self._lock:
                        self._connecting.discard(conn)
        finally:
            self._after_connect()
        return conn

    def shut(self) -> List[HubConnection]:
        """Lock held: refuse from now on; returns the connects in progress, to abort."""
        self.closed = True
        return list(self._connecting)

    def close(self, conns: List[HubConnection]) -> None:
        """Close connections while none of this agent's turns is in flight."""
        if conns:
            with self.gate.change():
                for conn in conns:
                    conn.close()

    def close_later(self, conns: List[HubConnection]) -> None:
        """`close`, on a thread of its own (the caller is about to start a turn)."""
        if conns:
            background.start(threading.Thread(target=self.close, args=(conns,), daemon=True,
                                              name="hivemind-chat-retire"))


class PoolParts:
    """The pieces both policies work with, and the pool too."""

    def __init__(self, config: ClientConfig, connector: Connector, lock: threading.Lock,
                 clock: Clock):
        self.config = config
        self.connector = connector
        self.lock = lock
        self.clock = clock
        self.leases = Leases()
        self.pins: Dict[str, int] = {}   # sessions whose idle connection must stay open

    def file(self, conn: HubConnection, session_id: str, place: Place,
             lease: bool = True) -> HubConnection:
        """Lease the connection and file it with `place`, unless the pool was shut down
        meanwhile; then close what `place` displaced."""
        with self.lock:
            if self.connector.closed:
                conn.close()
                self.connector.check_open()
            self.leases.file(conn, self.clock.now(), lease)
            evicted = place(conn, session_id)
        self.connector.close(evicted)
        return conn
