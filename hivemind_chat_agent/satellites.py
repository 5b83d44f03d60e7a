"""Hub-side bookkeeping of satellites' sessions, without I/O.

A satellite declares its own session id, and two satellites may declare the same one. The engine
must see one conversation per satellite session, stable across turns and reconnects, so the
engine's session_id is the declared id namespaced by the satellite's access key (hashed: session
ids end up in logs, keys must not). Entries expire after a TTL and are dropped on disconnect.
"""
import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Set


def client_fingerprint(access_key: str) -> str:
    return hashlib.sha256(f"hivemind-chat-sat:{access_key}".encode()).hexdigest()[:10]


def engine_session_id(access_key: str, declared_session_id: str) -> str:
    return f"sat-{client_fingerprint(access_key)}-{declared_session_id}"


@dataclass
class _Entry:
    last_seen: float
    peers: Set[str] = field(default_factory=set)


class SatelliteSessions:
    def __init__(self, ttl: float):
        self.ttl = ttl
        self._entries: Dict[str, _Entry] = {}

    def touch(self, session_id: str, peer: str, now: float) -> None:
        entry = self._entries.get(session_id)
        if entry is None:
            entry = self._entries[session_id] = _Entry(now)
        entry.last_seen = now
        entry.peers.add(peer)

    def expired(self, now: float) -> List[str]:
        """Forget and return the sessions not seen for `ttl` seconds."""
        old = [sid for sid, e in self._entries.items() if now - e.last_seen >= self.ttl]
        for sid in old:
            del self._entries[sid]
        return old

    def disconnected(self, peer: str) -> List[str]:
        """Forget and return the sessions whose last connection was `peer`."""
        gone = []
        for sid, entry in list(self._entries.items()):
            entry.peers.discard(peer)
            if not entry.peers:
                del self._entries[sid]
                gone.append(sid)
        return gone

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)
