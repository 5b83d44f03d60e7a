"""A connection of its own for every session: the pool's policy on hubs that bind the HELLO's
Session to the connection (4.x), or with `share_connections` off.

Connections are bounded by `max_connections`, least recently used first; a connection a turn
holds, or whose session someone listens to (pinned), is never evicted, so the pool can run over
the bound while every connection is busy (the reaper trims it once turns end). A new session
claims a spare (client/spares.py: handshake done, no HELLO yet) when one is ready, so its first
turn pays one HELLO frame instead of the password handshake.
"""
from collections import OrderedDict
from typing import List, Optional

from ovos_bus_client.session import Session
from ovos_utils.log import LOG

from hivemind_chat_agent.client.abandonment import Abandonment
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.client.pool_parts import PoolParts
from hivemind_chat_agent.client.spares import Spares
from hivemind_chat_agent.errors import HiveMindChatError


class OwnConnections:
    """Session id -> its connection, in least recently used order."""

    shares_connections = False

    def __init__(self, parts: PoolParts, spares: Spares):
        self._parts = parts
        self._spares = spares
        self._conns: "OrderedDict[str, HubConnection]" = OrderedDict()

    def acquire(self, session: Session,
                abandonment: Optional[Abandonment] = None) -> HubConnection:
        """The session's live connection, else a claimed spare, else a new connection; leased.
        Callers serialize per session, so two connects for one session never race."""
        parts, sid = self._parts, session.session_id
        with parts.lock:
            parts.connector.check_open()
            conn = self._conns.get(sid)
            if conn is not None:
                if conn.alive:
                    self._conns.move_to_end(sid)
                    parts.leases.take(conn)
                    return conn
                del self._conns[sid]
                parts.leases.forget(conn)
        if conn is not None:
            parts.connector.close([conn])
        claimed = self._claim_spare(session)
        if claimed is not None:
            return claimed
        return parts.file(parts.connector.open(session, abandonment), sid, self.place)

    def _claim_spare(self, session: Session) -> Optional[HubConnection]:
        """A spare made this session's own connection (its HELLO kept apart from turns in
        flight, like a connect), or None when there is none."""
        while True:
            conn = self._spares.take()
            if conn is None:
                self._spares.refill_soon()    # all taken or dead (a hub restart): start again
                return None
            try:
                with self._parts.connector.gate.change():
                    conn.claim(session)
            except HiveMindChatError:
                conn.close()
                continue
            self._parts.file(conn, session.session_id, self.place)   # leased: no refill yet
            self._spares.refill_soon()
            return conn

    def place(self, conn: HubConnection, session_id: str) -> List[HubConnection]:
        self._conns[session_id] = conn
        return self._evict_over_bound(keep=session_id)

    def peek(self, session_id: str) -> Optional[HubConnection]:
        return self._conns.get(session_id)

    def discard(self, session_id: str) -> List[HubConnection]:
        conn = self._conns.pop(session_id, None)
        if conn is None:
            return []
        self._parts.leases.forget(conn)
        return [conn]

    def reap(self, now: float) -> List[HubConnection]:
        """Connections no turn holds that are dead, or idle for `idle_timeout` with nobody
        listening to their session; then any over the bound."""
        leases, pins = self._parts.leases, self._parts.pins
        timeout = self._parts.config.idle_timeout
        idle = [sid for sid, c in self._conns.items()
                if not leases.holders(c) and (not c.alive or (
                    leases.idle_for(c, now) >= timeout and sid not in pins))]
        conns = [self._conns.pop(sid) for sid in idle]
        for conn in conns:
            leases.forget(conn)
        return conns + self._evict_over_bound(keep=None)

    def clear(self) -> None:
        self._conns.clear()

    def __len__(self) -> int:
        return len(self._conns)

    def _evict_over_bound(self, keep: Optional[str]) -> List[HubConnection]:
        leases, bound = self._parts.leases, self._parts.config.max_connections
        evicted = []
        for sid in list(self._conns):
            if len(self._conns) <= bound:
                break
            conn = self._conns[sid]
            if sid != keep and not leases.holders(conn) and sid not in self._parts.pins:
                evicted.append(self._conns.pop(sid))
                leases.forget(conn)
        if len(self._conns) > bound:
            LOG.debug(f"{len(self._conns)} connections are busy, over max_connections="
                      f"{bound}; idle ones are closed as turns end")
        return evicted
