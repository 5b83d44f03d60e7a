"""What the OVOS mode keeps of each satellite session and connection it follows, and a message
as each side must see it, without I/O (core/ovos_routes.OvosRoutes holds the table).

The namespacing goes both ways: on the way to the bus a message's Session carries the
namespaced id (the one no other satellite can name, hub/senders.identify), on the way back the
satellite gets its own declared id and the name hivemind-core knows its connection by now (a
HELLO renames it). Both rewrites copy: the caller's message is never changed.
"""
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Set

NAMES_PER_CONNECTION = 8   # peer names a connection is known by (a HELLO renames it)
RECENT_FRAMES = 16   # first frames of one session whose twin may still come (utterances in flight)


@dataclass
class FollowedSession:
    """A namespaced session OVOS has seen from a satellite, until it expires or is evicted."""
    client: str
    declared: str
    last_seen: float
    last_conn: str = ""
    # the last unmarked frames routed, each until its twin came (core/ovos_replies.is_twin)
    recent_frames: Deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_FRAMES))
    in_flight: Deque[Any] = field(default_factory=deque)   # (sent at, Outbound), oldest first


@dataclass
class SatelliteConnection:
    """A live satellite connection: the peer names it had (newest last) and its sessions."""
    client: str
    handle: Any
    names: "OrderedDict[str, None]" = field(default_factory=OrderedDict)
    sessions: Set[str] = field(default_factory=set)

    @property
    def current_name(self) -> str:
        """The peer name hivemind-core knows this connection by now (its latest)."""
        return next(reversed(self.names))

    def known_as(self, peer: str) -> List[str]:
        """`peer` is this connection's newest name; returns the oldest names beyond
        NAMES_PER_CONNECTION, which it is no longer known by."""
        self.names[peer] = None
        self.names.move_to_end(peer)
        dropped = []
        while len(self.names) > NAMES_PER_CONNECTION:
            dropped.append(self.names.popitem(last=False)[0])
        return dropped


def for_bus(message: Dict[str, Any], session_id: str) -> Dict[str, Any]:
    """A satellite's message as the bus gets it: its Session (kept, or a new one) under the
    namespaced `session_id`, whatever id the satellite declared."""
    context = dict(message.get("context") or {})
    session = context.get("session")
    session = dict(session) if isinstance(session, dict) else {}
    session["session_id"] = session_id
    context["session"] = session
    return {"type": message.get("type"), "data": message.get("data") or {}, "context": context}


def for_satellite(message: Dict[str, Any], destination: str,
                  declared_session: Optional[str]) -> Dict[str, Any]:
    """A bus message as one satellite gets it: addressed to its connection's current name and,
    when it is that satellite's session (`declared_session` not None), under its declared id."""
    context = dict(message["context"])
    context["destination"] = destination
    if declared_session is not None:
        context["session"] = dict(context["session"], session_id=declared_session)
    return {"type": message.get("type"), "data": message.get("data") or {}, "context": context}
