"""Hub-side bookkeeping of satellites' sessions, without I/O.

A satellite declares its own session id, and two satellites may declare the same one. The engine
must see one conversation per satellite session, stable across turns and reconnects, so the
engine's session_id is the declared id namespaced by the satellite's access key, keyed with a
secret of the hub's own (HMAC: session ids end up in logs, keys must not, and no satellite can
compute another's id; hub/secret.py keeps it). Entries expire after a TTL and are dropped on
disconnect.
"""
import hashlib
import hmac
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set


def client_fingerprint(secret: bytes, access_key: str) -> str:
    return hmac.new(secret, access_key.encode(), hashlib.sha256).hexdigest()[:16]


def engine_session_id(secret: bytes, access_key: str, declared_session_id: str) -> str:
    return f"sat-{client_fingerprint(secret, access_key)}-{declared_session_id}"


@dataclass
class _Entry:
    last_seen: float
    client: str = ""
    conns: Set[str] = field(default_factory=set)


class SatelliteSessions:
    """Sessions by the connections that used them. A connection is known by a token of its
    own, not by hivemind-core's peer string, which changes with every HELLO (name::session):
    cleanup by peer string missed every session but the last one (3,000 re-HELLOs left 3,000
    sessions behind). The hub plugin hears of a closing connection by its object (hence its
    token, `closed`) and by its latest peer string (`disconnected`); only that latest name is
    kept, so re-HELLOs on a live connection cost nothing here.

    One client (access key) keeps at most `max_per_client` sessions: a new one beyond that
    evicts the client's least recently seen, so a satellite inventing session ids while staying
    connected holds a bounded share of the hub's memory."""

    def __init__(self, ttl: float, max_per_client: Optional[int] = None):
        self.ttl = ttl
        self.max_per_client = max_per_client
        self._entries: Dict[str, _Entry] = {}
        self._of_client: Dict[str, "OrderedDict[str, None]"] = {}   # least recent first
        self._sessions_of_conn: Dict[str, Set[str]] = {}
        self._conn_of_peer: Dict[str, str] = {}
        self._peer_of_conn: Dict[str, str] = {}

    def touch(self, session_id: str, conn: str, peer: str, now: float,
              client: str = "") -> List[str]:
        """Record a turn of `session_id`; return the sessions evicted to make room for it."""
        entry = self._entries.get(session_id)
        if entry is None:
            entry = self._entries[session_id] = _Entry(now, client)
        entry.last_seen = now
        entry.conns.add(conn)
        self._sessions_of_conn.setdefault(conn, set()).add(session_id)
        old_peer = self._peer_of_conn.get(conn)
        if old_peer != peer:
            if old_peer is not None and self._conn_of_peer.get(old_peer) == conn:
                del self._conn_of_peer[old_peer]
            self._conn_of_peer[peer] = conn
            self._peer_of_conn[conn] = peer
        recent = self._of_client.setdefault(entry.client, OrderedDict())
        recent[session_id] = None
        recent.move_to_end(session_id)
        evicted = []
        while self.max_per_client and len(recent) > self.max_per_client:
            evicted.append(next(iter(recent)))
            self._drop(evicted[-1])
        return evicted

    def _drop(self, session_id: str) -> None:
        entry = self._entries.pop(session_id)
        for conn in entry.conns:
            self._sessions_of_conn.get(conn, set()).discard(session_id)
        recent = self._of_client.get(entry.client)
        if recent is not None:
            recent.pop(session_id, None)
            if not recent:
                del self._of_client[entry.client]

    def expired(self, now: float) -> List[str]:
        """Forget and return the sessions not seen for `ttl` seconds."""
        old = [sid for sid, e in self._entries.items() if now - e.last_seen >= self.ttl]
        for sid in old:
            self._drop(sid)
        return old

    def disconnected(self, peer: str) -> List[str]:
        """The connection last seen as `peer` closed: see `closed`."""
        conn = self._conn_of_peer.get(peer)
        return [] if conn is None else self.closed(conn)

    def closed(self, conn: str) -> List[str]:
        """Forget the connection; return the sessions no other connection still uses."""
        peer = self._peer_of_conn.pop(conn, None)
        if peer is not None and self._conn_of_peer.get(peer) == conn:
            del self._conn_of_peer[peer]
        gone = []
        for sid in self._sessions_of_conn.pop(conn, ()):
            entry = self._entries.get(sid)
            if entry is None:
                continue
            entry.conns.discard(conn)
            if not entry.conns:
                self._drop(sid)
                gone.append(sid)
        return gone

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def peers(self) -> int:
        """How many connections' names are kept (one per connection)."""
        return len(self._conn_of_peer)

    @property
    def clients(self) -> int:
        """How many clients (access keys) have sessions kept: each holds at most
        `max_per_client`, and a client whose sessions are all gone costs nothing here."""
        return len(self._of_client)
