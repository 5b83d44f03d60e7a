"""Every session of the agent over a few shared connections: the pool's policy on hubs that read
each message's Session (5.x, `many_sessions` in the handshake).

A new conversation pays no handshake: it joins the least busy connection, and a session stays
on the connection it last used (sticky: the hub sends its speech between turns there). Another
connection is opened only while every open one has `TURNS_PER_SHARED` turns in flight, up to
`shared_connections`, one at a time. Should a connection see the hub answer a session under
another id (it then clears `many_sessions`), this policy ends: its connections are retired
and the pool falls back to a connection per session (client/pool_own.py).
"""
import threading
from collections import OrderedDict
from typing import List, Optional

from ovos_bus_client.session import Session

from hivemind_chat_agent.client.abandonment import Abandonment
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.client.pool_parts import PoolParts

TURNS_PER_SHARED = 16   # turns in flight on a shared connection before another is opened


class SharedConnections:
    """The shared connections, and each session's last one."""

    shares_connections = True

    def __init__(self, parts: PoolParts):
        self._parts = parts
        self._shared: List[HubConnection] = []
        self._sticky: "OrderedDict[str, HubConnection]" = OrderedDict()  # session -> its last
        self._opening = threading.Lock()      # shared connections open one at a time
        self.usable = True                    # until the hub mixes up sessions

    def acquire(self, session: Session,
                abandonment: Optional[Abandonment] = None) -> Optional[HubConnection]:
        """A shared connection for this session, leased, or None once the hub showed it
        cannot share."""
        parts, sid = self._parts, session.session_id
        while True:
            with parts.lock:
                parts.connector.check_open()
                stale = self._drop_unusable()
                if not self.usable:
                    break
                conn = self._choose(sid)
                if conn is not None:
                    self._stick(sid, conn)
                    parts.leases.take(conn)
                    parts.connector.close_later(stale)
                    return conn
            parts.connector.close_later(stale)
            with self._opening:
                with parts.lock:
                    if len(self._shared) >= parts.config.shared_connections or any(
                            parts.leases.holders(c) < TURNS_PER_SHARED for c in self._shared):
                        continue             # another thread opened one meanwhile
                return parts.file(parts.connector.open(session), sid, self.place)
        parts.connector.close_later(stale)
        return None

    def _choose(self, sid: str) -> Optional[HubConnection]:
        """Lock held: the session's last connection, else the least busy one, else None: all
        are busy and there is room for another."""
        leases = self._parts.leases
        conn = self._sticky.get(sid)
        if conn is not None and conn in self._shared:
            return conn
        full = self._opening.locked() or \
            len(self._shared) >= self._parts.config.shared_connections
        conn = min(self._shared, key=leases.holders, default=None)
        if conn is not None and leases.holders(conn) >= TURNS_PER_SHARED and not full:
            return None
        return conn

    def place(self, conn: HubConnection, session_id: str) -> List[HubConnection]:
        self._shared.append(conn)
        self._stick(session_id, conn)
        return []

    def peek(self, session_id: str) -> Optional[HubConnection]:
        conn = self._sticky.get(session_id)
        return conn if conn in self._shared else None

    def discard(self, session_id: str) -> List[HubConnection]:
        """Other sessions' turns may be on it: retired, it closes with its last turn."""
        conn = self._sticky.pop(session_id, None)
        if conn is None or conn not in self._shared:
            return []
        self._shared.remove(conn)
        return [conn] if self._parts.leases.retire(conn) else []

    def reap(self, now: float) -> List[HubConnection]:
        """Connections no turn holds that are dead, or idle for `idle_timeout` with nobody
        listening to any session that last used them."""
        leases, timeout = self._parts.leases, self._parts.config.idle_timeout
        listened = {id(self._sticky.get(sid)) for sid in self._parts.pins}
        idle = [c for c in self._shared
                if not leases.holders(c) and (not c.alive or (
                    leases.idle_for(c, now) >= timeout and id(c) not in listened))]
        self._shared = [c for c in self._shared if c not in idle]
        for conn in idle:
            leases.forget(conn)
        return idle

    def clear(self) -> None:
        self._shared, self._sticky = [], OrderedDict()

    def __len__(self) -> int:
        return len(self._shared)

    def _drop_unusable(self) -> List[HubConnection]:
        """Lock held: retire dead connections, and every one once a connection saw
        the hub mix up sessions (sharing ends for good); returns those no turn holds, to
        close (the others close with their last turn)."""
        if any(not c.many_sessions for c in self._shared):
            self.usable = False
        keep = [c for c in self._shared if self.usable and c.alive]
        gone = [c for c in self._shared if c not in keep]
        self._shared = keep     # a retired one left the list when it was retired
        return [c for c in gone if self._parts.leases.retire(c)]

    def _stick(self, sid: str, conn: HubConnection) -> None:
        self._sticky[sid] = conn
        self._sticky.move_to_end(sid)
        while len(self._sticky) > self._parts.config.max_sessions:
            self._sticky.popitem(last=False)
