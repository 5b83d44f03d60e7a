"""Connections kept per session_id: opened on first use, reused, closed when idle, bounded (LRU).

Closing a connection loses nothing: a conversation's state is its Session in SessionManager,
which the next connection sends in its HELLO and with every utterance.
"""
import threading
import time
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Set

from ovos_bus_client.session import Session
from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.core.churn_gate import ChurnGate
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.errors import AgentClosedError


class ConnectionPool:
    def __init__(self, config: ClientConfig,
                 factory: Callable[[ClientConfig, Session], HubConnection] = HubConnection,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._factory = factory
        self._clock = clock
        self._lock = threading.Lock()
        self._conns: "OrderedDict[str, HubConnection]" = OrderedDict()
        self._pinned: Dict[str, int] = {}   # sessions whose idle connection must stay open
        self._connecting: Set[HubConnection] = set()
        self._closed = False
        self._stop = threading.Event()
        self._reaper: Optional[threading.Thread] = None
        self.gate = ChurnGate(config.churn_guard,    # turns hold `gate.turn()`
                              stagger=0.025 if config.churn_guard > 0 else 0.0)

    def acquire(self, session: Session) -> HubConnection:
        """The live connection for this session, connecting if needed, leased to the caller until
        `release()` (callers serialize per session, so two connects for one session never
        race)."""
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
        with self.gate.change():
            if conn is not None:
                conn.close()
            conn = self._factory(self.config, session)
            with self._lock:
                self._check_open()
                self._connecting.add(conn)      # so close_all() can end the connect at once
            try:
                conn.connect()
            finally:
                with self._lock:
                    self._connecting.discard(conn)
        with self._lock:
            if self._closed:
                conn.close()
                self._check_open()
            self._conns[sid] = conn
            conn.leases += 1
            evicted = self._evict_over_bound(keep=sid)
            self._start_reaper()
        self._close(evicted)
        return conn

    def release(self, conn: HubConnection) -> None:
        """The caller's turn is over; the connection may be evicted or reaped again."""
        with self._lock:
            conn.leases -= 1
            conn.last_used = self._clock()

    def peek(self, session_id: str) -> Optional[HubConnection]:
        """The session's open connection, if any, without leasing it."""
        with self._lock:
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
        self._close(conns)
        return len(conns)

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._conns.values())
            self._conns.clear()
            connecting = list(self._connecting)
            reaper, self._reaper = self._reaper, None
        for conn in connecting:
            conn.abort_connect(AgentClosedError("the agent was shut down while connecting"))
        self._stop.set()
        for conn in conns:
            conn.close()
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join(timeout=5)

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns)

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
