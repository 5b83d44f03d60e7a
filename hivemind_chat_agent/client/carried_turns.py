"""The turns one connection carries, and which of them a reply from the hub belongs to.

Bookkeeping only, no socket: `HubConnection` (the I/O shell) tells it what it sent and hands it
what the hub said; each turn's sentences go straight to its `TurnSink` (the caller's
`ChatTurn`, the one place they are kept) and its end to the driver waiting on its
`TurnHandle`; it answers whether the reply refreshes a Session. The decisions themselves are
`core/turns.TurnTable`'s (which turn, when it is over) and `core/ownership.claim`'s (whose
session id); this object keeps them consistent under one lock, per connection.
"""
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Protocol, Tuple

from ovos_bus_client.message import Message
from ovos_utils.log import LOG

from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.outcomes import Outcome
from hivemind_chat_agent.core.ownership import claim, namespace_of
from hivemind_chat_agent.core.replies import Reply, ReplyKind
from hivemind_chat_agent.core.turns import (
    Absorb,
    Ended,
    EndReason,
    Event,
    Progress,
    Routing,
    Sentence,
    Turn,
    TurnTable,
)
from hivemind_chat_agent.errors import HiveMindChatError


class TurnSink(Protocol):
    """Where one turn goes as it happens: the one hand-off between the socket side and the
    caller's object (client/chat_turn.ChatTurn implements it). The connection's socket thread
    calls `add_sentence` the moment a sentence of the turn arrives, and `hub_stopped` when a
    skill says it stopped; the turn's driver calls `end` once, after the turn was judged and
    its resources given back. Each call is short (no I/O, no waiting): the socket thread
    makes it holding its connection's turn lock."""

    def add_sentence(self, text: str) -> None:
        """The next sentence of the answer, in order."""

    def hub_stopped(self, skill_id: str) -> None:
        """A skill on the hub said it stopped this answer (barge-in)."""

    def end(self, outcome: Outcome) -> None:
        """The turn is over and its session free; nothing more comes."""


class TurnHandle:
    """One turn as its connection carries it: the state machine (`turn`), the sink its
    sentences go to as they arrive, and its end, which the turn's driver waits for. It keeps
    no sentence itself: the sink holds them, once."""

    def __init__(self, turn: Turn, sink: TurnSink):
        self.turn = turn
        self.sink = sink
        self._ended: Optional[Ended] = None
        self._arrived = threading.Condition()
        self.error: Optional[HiveMindChatError] = None   # why the hub refused it, if it did
        self.message: Optional[Message] = None           # what was sent, for a topic retry
        self.replied = False                             # some reply of this turn arrived

    def take(self, events: List[Event]) -> None:
        """The events the turn's state machine gave out: sentences to the sink, the end (only
        the first: a state machine gives one) to the driver waiting in `wait_end`."""
        for event in events:
            if isinstance(event, Sentence):
                self.sink.add_sentence(event.text)
                continue
            with self._arrived:
                if self._ended is None:
                    self._ended = event
                    self._arrived.notify_all()

    def wait_end(self, clock: Clock, timeout: float) -> Optional[Ended]:
        """The turn's end, waiting up to `timeout` seconds on `clock` for it; None if it has
        not come by then."""
        with self._arrived:
            if self._ended is None and timeout > 0:
                clock.wait(self._arrived, timeout)
            return self._ended


class CarriedTurns:
    def __init__(self, book: SessionBook, clock: Clock, max_sessions: int):
        self._book = book
        self.clock = clock          # every turn deadline here is read on it
        self._max_sessions = max_sessions
        # reentrant: a fake clock's wait (tests) runs what falls due, a reply among them, on
        # the waiting thread
        self._lock = threading.RLock()
        self._heard = threading.Condition(self._lock)   # a skill listens, or a question ended
        self._table = TurnTable()
        self._handles: Dict[str, TurnHandle] = {}       # session id -> its turn in progress
        self._tags: Dict[str, str] = {}                 # open turn tag -> its session id
        self._carried: "OrderedDict[str, None]" = OrderedDict()   # sessions it has carried
        self._namespace: Optional[str] = None   # our prefix on a 4.13-4.14 hub, once seen
        self.untagged = False                   # the hub dropped our turn tag from some reply
        self._lost = False                      # the connection went: nothing more is heard

    def wait_for_listener(self, session_id: str) -> None:
        """Before a turn of this session is sent: while a skill's question is open, wait until
        the skill listens for the answer, bounded by `TurnTable.listening_by` (at once when no
        question is open, or the hub never says it listens; at once when the connection is lost
        meanwhile: `open` then says so)."""
        with self._heard:
            while not self._lost:
                until = self._table.listening_by(session_id)
                remaining = 0.0 if until is None else until - self.clock.now()
                if remaining <= 0:
                    return
                self.clock.wait(self._heard, remaining)

    def open(self, session_id: str, tag: str, timeout: float, sink: TurnSink,
             check: Callable[[], None] = lambda: None) -> TurnHandle:
        """A new turn of this session, its sentences going to `sink`; `check` raises, under
        the lock, if the connection can no longer take it."""
        handle = TurnHandle(Turn(session_id=session_id, tag=tag, timeout=timeout,
                                 started_at=self.clock.now()), sink)
        with self._lock:
            check()
            self._table.open(handle.turn)
            self._handles[session_id] = handle
            self._tags[tag] = session_id
            self._carried[session_id] = None
            self._carried.move_to_end(session_id)
            while len(self._carried) > self._max_sessions:
                self._carried.popitem(last=False)
        return handle

    def finish(self, handle: TurnHandle, stopped: bool = False) -> None:
        with self._lock:
            self._table.close(handle.turn, stopped)
            if self._handles.get(handle.turn.session_id) is handle:
                del self._handles[handle.turn.session_id]
            self._tags.pop(handle.turn.tag, None)

    def expire(self, handle: TurnHandle) -> None:
        with self._lock:
            handle.take(handle.turn.expire(self.clock.now()))

    def abort(self, handle: TurnHandle, reason: str) -> None:
        with self._lock:
            handle.take(handle.turn.abort(reason))

    def is_open(self, session_id: str) -> bool:
        with self._lock:
            handle = self._handles.get(session_id)
            return handle is not None and not handle.turn.state.is_final

    def awaits_audio_end(self, session_id: str) -> bool:
        """A turn of the session is in progress, or a skill asked it a question and has not
        said it listens: get_response() speaks its question with wait=True and listens only
        after the audio end, so an audio end it missed must be repeated though no turn runs
        (the next turn waits for that skill: wait_for_listener)."""
        with self._lock:
            handle = self._handles.get(session_id)
            return (handle is not None and not handle.turn.state.is_final) or \
                self._table.listening_by(session_id) is not None

    def unanswered(self, msg_type: str) -> List[TurnHandle]:
        """Turns sent as `msg_type` that got nothing back: what a denial can be about."""
        with self._lock:
            return [h for h in self._handles.values()
                    if h.message is not None and h.message.msg_type == msg_type
                    and not h.replied and not h.turn.state.is_final]

    def refuse(self, handles: Optional[List[TurnHandle]], error: HiveMindChatError) -> None:
        """The hub refused these turns (None: every one): each ends with `error`."""
        with self._lock:
            for handle in list(self._handles.values()) if handles is None else handles:
                handle.error = error
                handle.take(handle.turn.lose(str(error), EndReason.REFUSED))

    def lose_all(self, reason: str, kind: EndReason = EndReason.NONE,
                 unsent: bool = False) -> None:
        """End every open turn as lost; with `unsent`, those that got nothing back yet as
        never read by the hub (EndReason.UNSENT: sent again)."""
        with self._lock:
            self._lost = True
            self._heard.notify_all()            # a turn waiting for a listener goes on: lost
            for handle in self._handles.values():
                waiting = handle.turn.state is Progress.WAITING
                handle.take(handle.turn.lose(reason, EndReason.UNSENT if unsent and waiting
                                             else kind))

    def route(self, reply: Reply, own_id: str,
              sharing: bool) -> Tuple[Optional[Reply], Optional[Routing], bool]:
        """(the reply under our session id or None if it is not ours, what it means for our
        turns (None for a skill's answer to our stop), whether the hub showed it cannot
        share). The reply's events reach its turn's handle, and its Session is taken as the
        routing says."""
        with self._lock:
            owner, namespaced = claim(reply.session_id, reply.turn_tag, self._tags,
                                      lambda sid: sid == own_id or
                                      (sharing and sid in self._carried),
                                      self._namespace)
            if namespaced and reply.turn_tag in self._tags:   # a turn of ours showed our prefix
                self._namespace = namespace_of(reply.session_id)
            if owner is None:
                LOG.debug(f"ignoring {reply.msg_type} for another session")
                return None, None, False
            unshare = namespaced and sharing
            if unshare:
                LOG.warning(f"the hub answers session {owner} under its own namespace "
                            f"({reply.session_id}): from now on each session gets a "
                            "connection of its own")
            if namespaced:      # routed under our id; absorb() refuses the hub's id
                reply = replace(reply, session_id=owner)
            if reply.kind is ReplyKind.STOPPED:
                return reply, None, unshare
            routing = self._table.route(reply, self.clock.now())
            if reply.kind in (ReplyKind.QUESTION_LISTENING, ReplyKind.HANDLED):
                self._heard.notify_all()
            if routing.absorb is not Absorb.NOTHING and reply.session is not None:
                self._book.absorb(reply.session_id, reply.session,
                                  response_mode_only=routing.absorb is Absorb.RESPONSE_MODE)
            if routing.turn is not None:
                handle = self._handles[routing.turn.session_id]
                handle.replied = True
                if reply.turn_tag is None:
                    self.untagged = True
                handle.take(routing.events)
            return reply, routing, unshare
