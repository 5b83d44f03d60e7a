"""The OVOS mode's routing decisions, without I/O: what a satellite's message becomes on the
local OVOS messagebus, which satellite a bus message goes back to (and under which session id),
and the bounds and fairness between satellites (what is kept of a session and connection, and
the rewrites both ways: core/ovos_sessions.py). What it takes and gives are the plain values of
core/ovos_route_terms.py.

The hub plugin in OVOS mode (hub/ovos_mode.py) stands where hivemind-ovos-agent-plugin stands:
between hivemind-core's satellites and ovos-core's messagebus. Its shell identifies the sender
(hub/senders.py: authenticated, its declared session id bounded, its namespaced session id
keyed with the access key and the hub's secret) and hands that here as a `Satellite`; this
object decides, and the shell carries the decision out on the right thread.

Satellite → OVOS. `accept` rewrites the Session's id to the namespaced one (so no satellite
can name, read or write another's OVOS Session, whatever id it declares, on 4.0 and 5.x alike)
and queues the message under its client (access key). `next_outbound` takes the queues in
turn, one message per client each round, so a flooding client only ever waits behind itself.
Bounds: a client's queue (`max_queued_per_client`; a satellite's stop goes to its front), the
utterances a session and a client may have in flight at OVOS (`max_in_flight_per_session`,
`max_in_flight_per_client`; a `get_response` hand-over closes one as its `handled` would, and
one whose end never comes is forgotten after `in_flight_timeout`), the sessions a client may
keep (`max_sessions_per_client`, least recently seen evicted) and how long an idle one is kept
(`session_ttl`); a connection they refused is on probation for a while (core/ovos_probation.py:
one utterance at a time, none beside another satellite's, OVOS busy a quarter of the time at
most). A refused utterance, and one that cannot reach OVOS (the bus is down, or went down while
it was queued or in flight), gets the chat mode's failure shape: a `complete_intent_failure`
with the reason, then `ovos.utterance.handled` (`failure_replies`).

OVOS → satellite. `route` delivers a bus message only to the satellites its
`context["destination"]` names (as the stock plugin does), never for a message whose
`context["source"]` is a satellite (a request: the bus echoes what we sent), and only when its
Session, if it has one, is that satellite's own: then the satellite's declared id is put back.
Speech between turns (an alarm set in an earlier turn) names the peer the satellite had then;
if that peer is gone but the session is still followed, it goes to the connection that used the
session last, which is the same satellite (same access key, same declared session).
"""
from collections import OrderedDict, deque
from typing import Any, Callable, Deque, Dict, List, Optional

from hivemind_chat_agent.core.health import STOPPED, TIMED_OUT
from hivemind_chat_agent.core.ovos_outcomes import UtteranceOutcomes
from hivemind_chat_agent.core.ovos_probation import Probation
from hivemind_chat_agent.core.ovos_replies import is_twin
from hivemind_chat_agent.core.ovos_route_terms import (
    Delivery,
    Outbound,
    Refusal,
    RouteLimits,
    Satellite,
)
from hivemind_chat_agent.core.ovos_sessions import (
    FollowedSession,
    SatelliteConnection,
    for_bus,
    for_satellite,
)
from hivemind_chat_agent.core.protocol_names import (
    ANSWER_TAKEN_SUFFIX,
    HANDLED_TYPE,
    STOP_TYPES,
    UTTERANCE_TYPES,
)
from hivemind_chat_agent.core.turns import EndReason

SWEEP_EVERY = 1.0          # seconds between looks for expired sessions and in-flight entries
BUS_DOWN_WHY = "the hub's OVOS messagebus is not connected"


class OvosRoutes:
    """The routing table and queues of the OVOS mode. Thread-safe by its caller: the shell
    holds one lock around every call (IO loop, bus thread and sender thread all use it)."""

    def __init__(self, limits: RouteLimits, now: Callable[[], float], metrics: Any = None,
                 probation: Optional[Probation] = None):
        """`metrics`: what handled and forgotten utterances are counted on
        (core/ovos_outcomes.py), None for none; `probation`: the terms of a connection that
        went over the bounds (the default's)."""
        self.limits = limits
        self.probation = probation if probation is not None else Probation()
        self.now = now
        self.outcomes = UtteranceOutcomes(metrics)
        self.bus_up = False
        self.down_why = BUS_DOWN_WHY     # what a refused utterance is told while not bus_up
        self._next_sweep = 0.0
        self._sessions: Dict[str, FollowedSession] = {}
        self._of_client: Dict[str, "OrderedDict[str, None]"] = {}   # least recent first
        self._connections: Dict[str, SatelliteConnection] = {}
        self._conn_of_peer: Dict[str, str] = {}
        self._queues: "OrderedDict[str, Deque[Outbound]]" = OrderedDict()   # round robin

    # ---- satellite -> OVOS ----
    def accept(self, sender: Satellite, message: Dict[str, Any]) -> Optional[Refusal]:
        """Queue a satellite's message for the bus (its Session under the namespaced id);
        a Refusal (nothing queued) when a bound or the bus says no."""
        now = self.now()
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_EVERY
            self._expire(now)
        is_utterance = message.get("type") in UTTERANCE_TYPES
        if is_utterance and not self.bus_up:
            return Refusal(EndReason.BACKEND_UNAVAILABLE, self.down_why)
        queue = self._queues.get(sender.client)
        if queue is not None and len(queue) >= self.limits.max_queued_per_client:
            refusal: Optional[Refusal] = Refusal(
                EndReason.BUSY, f"{len(queue)} messages of this client are waiting for the "
                                "OVOS bus")
        else:
            refusal = self._in_flight_refusal(sender) if is_utterance else None
        if refusal is not None:             # over a bound: on probation from now
            self.probation.bound_refused(sender.conn, now)
            return refusal
        if is_utterance:
            why = self.probation.refusal(sender.conn, lambda: self._open_of(sender), now,
                                         lambda: self._good_standing_busy(now))
            if why:
                return Refusal(EndReason.BUSY, why)
        self._follow(sender, now)
        outbound = Outbound(for_bus(message, sender.session_id), sender, is_utterance)
        queue = self._queues.setdefault(sender.client, deque())
        if message.get("type") in STOP_TYPES:
            queue.appendleft(outbound)     # a barge-in overtakes the client's own backlog
        else:
            queue.append(outbound)
        return None

    def _in_flight_refusal(self, sender: Satellite) -> Optional[Refusal]:
        session = self._sessions.get(sender.session_id)
        queue = self._queues.get(sender.client, ())
        mine = (len(session.in_flight) if session else 0) + sum(
            o.is_utterance and o.sender.session_id == sender.session_id for o in queue)
        if mine >= self.limits.max_in_flight_per_session:
            return Refusal(EndReason.BUSY, f"{mine} utterances of this session are still "
                                           "being handled by OVOS")
        queued = sum(o.is_utterance for o in queue)
        client_total = queued + sum(len(self._sessions[s].in_flight)
                                    for s in self._of_client.get(sender.client, ()))
        if client_total >= self.limits.max_in_flight_per_client:
            return Refusal(EndReason.BUSY, f"{client_total} utterances of this client are "
                                           "still being handled by OVOS")
        return None

    def _open_of(self, sender: Satellite) -> int:
        """The utterances of `sender`'s connection queued or in flight at OVOS."""
        queued = sum(o.is_utterance and o.sender.conn == sender.conn
                     for o in self._queues.get(sender.client, ()))
        connection = self._connections.get(sender.conn)
        sessions = connection.sessions if connection is not None else ()
        followed = (self._sessions.get(sid) for sid in sessions)
        return queued + sum(1 for session in followed if session
                            for _, o in session.in_flight if o.sender.conn == sender.conn)

    def _good_standing_busy(self, now: float) -> bool:
        """An utterance of a connection not on probation is queued or in flight at OVOS."""
        return any(not self.probation.on_probation(o.sender.conn, now)
                   for o in self._utterances_open())

    def _follow(self, sender: Satellite, now: float) -> None:
        session = self._sessions.get(sender.session_id)
        if session is None:
            session = self._sessions[sender.session_id] = FollowedSession(
                sender.client, sender.declared_session, now)
        session.last_seen, session.last_conn = now, sender.conn
        recent = self._of_client.setdefault(sender.client, OrderedDict())
        recent[sender.session_id] = None
        recent.move_to_end(sender.session_id)
        while len(recent) > self.limits.max_sessions_per_client:
            self._forget_session(next(iter(recent)))
        conn = self._connections.get(sender.conn)
        if conn is None:
            conn = self._connections[sender.conn] = SatelliteConnection(sender.client,
                                                                        sender.handle)
        conn.sessions.add(sender.session_id)
        if sender.peer not in conn.names:
            self._conn_of_peer[sender.peer] = sender.conn
            for old in conn.known_as(sender.peer):
                if self._conn_of_peer.get(old) == sender.conn:
                    del self._conn_of_peer[old]

    def has_outbound(self) -> bool:
        return bool(self._queues)

    def next_outbound(self) -> Optional[Outbound]:
        """The next message for the bus: the next client's oldest, round robin. An utterance
        is in flight from now until its `handled` (taken before the shell writes it: the
        answer may come before the write returns); the shell says `unsent` if the write
        fails."""
        if not self._queues:
            return None
        client, queue = next(iter(self._queues.items()))
        outbound = queue.popleft()
        del self._queues[client]
        if queue:
            self._queues[client] = queue       # to the back of the round
        session = self._sessions.get(outbound.sender.session_id)
        if outbound.is_utterance and session is not None:
            session.in_flight.append((self.now(), outbound))
        return outbound

    def unsent(self, outbound: Outbound) -> bool:
        """`outbound` could not be written to the bus. True: tell its satellite (it was still
        in flight, or is not an utterance); False: told already (`bus_lost` returned it), or
        nobody to tell (its session was forgotten with its connection)."""
        if not outbound.is_utterance:
            return True
        session = self._sessions.get(outbound.sender.session_id)
        if session is None:
            return False
        entry = next((e for e in session.in_flight if e[1] is outbound), None)
        if entry is None:
            return False
        session.in_flight.remove(entry)
        return True

    # ---- the bus ----
    def bus_connected(self) -> None:
        self.bus_up = True

    def skills_not_ready(self, why: str) -> None:
        """The bus is connected but OVOS cannot answer yet (core/skills_readiness.py):
        utterances are refused, saying `why`; other messages wait in their queues."""
        self.bus_up = False
        self.down_why = why

    def bus_lost(self) -> List[Outbound]:
        """The bus went down: every utterance queued or in flight is lost (its answer will
        never come); returns them, to be told."""
        self.bus_up = False
        self.down_why = BUS_DOWN_WHY
        lost = self._utterances_open()
        self._queues.clear()
        for sid, session in self._sessions.items():
            if session.in_flight:        # failed: counted by the shell as it tells them
                session.in_flight.clear()
                self.outcomes.forget(sid)
        return lost

    # ---- OVOS -> satellite ----
    def route(self, message: Dict[str, Any]) -> List[Delivery]:
        """The satellites a bus message goes to (see the module docstring)."""
        context = message.get("context")
        if not isinstance(context, dict):
            return []
        destination = context.get("destination")
        peers = [destination] if isinstance(destination, str) else destination
        if not isinstance(peers, list) or not peers:
            return []
        source = context.get("source")
        if isinstance(source, str) and source in self._conn_of_peer:
            return []                  # a satellite's own request, echoed by the bus
        session = context.get("session")
        sid = session.get("session_id") if isinstance(session, dict) else None
        followed = self._sessions.get(sid) if isinstance(sid, str) else None
        if sid is not None and followed is None:
            return []                  # a Session that is no satellite's: not theirs to read
        msg_type = message.get("type")
        if followed is not None and followed.in_flight and isinstance(msg_type, str) \
                and isinstance(sid, str):
            self.outcomes.seen(sid, msg_type, message.get("data"), followed.in_flight[0][0],
                               self.now())
        if followed is not None and isinstance(sid, str) and isinstance(msg_type, str) and (
                msg_type == HANDLED_TYPE or msg_type.endswith(ANSWER_TAKEN_SUFFIX)):
            # ovos-core hands an answer to a waiting get_response and never sends that
            # utterance a `handled` of its own (2.x; 3.x sends none for the question): the
            # hand-over closes one utterance of the session, so a dialog never piles up
            self._handled(sid)
        if followed is not None and is_twin(message, context, followed.recent_frames):
            return []
        conns = self._named_connections(peers, followed)
        return [self._delivery(conn, message, followed) for conn in conns]

    def _named_connections(self, peers: List[Any],
                           followed: Optional[FollowedSession]) -> List[str]:
        named, gone = [], False
        for peer in peers:
            if not isinstance(peer, str) or "::" not in peer:
                continue                         # "audio", "skills", a skill id
            conn = self._conn_of_peer.get(peer)
            if conn is None:
                gone = True                      # a name no live connection has now
                continue
            if followed is not None and self._connections[conn].client != followed.client:
                return []                        # another satellite's session: never
            if conn not in named:
                named.append(conn)
        if not named and gone and followed is not None \
                and followed.last_conn in self._connections:
            named.append(followed.last_conn)      # its peer is gone: the session's satellite
        return named

    def _delivery(self, conn: str, message: Dict[str, Any],
                  followed: Optional[FollowedSession]) -> Delivery:
        connection = self._connections[conn]
        destination = connection.current_name
        declared = followed.declared if followed is not None else None
        return Delivery(connection.handle, destination,
                        for_satellite(message, destination, declared))

    def _handled(self, sid: str, outcome: Optional[str] = None) -> None:
        session = self._sessions.get(sid)
        if session is not None and session.in_flight:
            self._end_oldest(sid, session, outcome)

    def _end_oldest(self, sid: str, session: FollowedSession, outcome: Optional[str]) -> None:
        sent_at, outbound = session.in_flight.popleft()
        now = self.now()
        self.outcomes.ended(sid, sent_at, now, outcome)
        self.probation.ended(outbound.sender.conn, sent_at, now)

    # ---- connections and time ----
    def closed(self, conn: str) -> None:
        """hivemind-core reported the connection gone: nothing more goes to it, its queued
        messages are dropped, its sessions used by no other connection are forgotten."""
        self.probation.closed(conn)
        connection = self._connections.pop(conn, None)
        if connection is None:
            return
        for name in connection.names:
            if self._conn_of_peer.get(name) == conn:
                del self._conn_of_peer[name]
        queue = self._queues.get(connection.client)
        if queue:
            kept = deque(o for o in queue if o.sender.conn != conn)
            if kept:
                self._queues[connection.client] = kept
            else:
                del self._queues[connection.client]
        others = {s for c in self._connections.values() for s in c.sessions}
        for sid in connection.sessions - others:
            self._forget_session(sid)

    def _expire(self, now: float) -> None:
        for sid, session in list(self._sessions.items()):
            while session.in_flight and now - session.in_flight[0][0] >= \
                    self.limits.in_flight_timeout:
                self._handled(sid, TIMED_OUT)
            if now - session.last_seen >= self.limits.session_ttl and not session.in_flight:
                self._forget_session(sid)

    def _forget_session(self, sid: str) -> None:
        session = self._sessions.pop(sid, None)
        if session is None:
            return
        while session.in_flight:          # its satellite left before OVOS handled them
            self._end_oldest(sid, session, STOPPED)
        self.outcomes.forget(sid)
        recent = self._of_client.get(session.client)
        if recent is not None:
            recent.pop(sid, None)
            if not recent:
                del self._of_client[session.client]
        for connection in self._connections.values():
            connection.sessions.discard(sid)

    def utterances_by_connection(self) -> Dict[str, int]:
        """The utterances each connection has queued or in flight at OVOS (not handled yet):
        what a draining hub waits for before it closes that connection."""
        counts: Dict[str, int] = {}
        for outbound in self._utterances_open():
            counts[outbound.sender.conn] = counts.get(outbound.sender.conn, 0) + 1
        return counts

    def _utterances_open(self) -> List[Outbound]:
        queued = [o for q in self._queues.values() for o in q if o.is_utterance]
        return queued + [o for s in self._sessions.values() for _, o in s.in_flight]

    def __len__(self) -> int:
        """Sessions followed."""
        return len(self._sessions)

    @property
    def connections(self) -> int:
        return len(self._connections)
