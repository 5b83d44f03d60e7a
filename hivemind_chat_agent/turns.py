"""Turn tracking without I/O: which reply belongs to which turn, and when a turn is over.

`TurnTable.route(reply)` is the single place where a reply from the hub is matched to its turn.
A `Turn` is an explicit state machine (WAITING -> SPEAKING -> one terminal state) that takes
replies and clock readings in and gives `Sentence`/`Ended` events out; the connection layer only
moves bytes and delivers those events. Nothing here touches a socket, a thread or the clock.
"""
from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional, Tuple, Union

from hivemind_chat_agent.replies import Reply, ReplyKind


class TurnState(str, Enum):
    WAITING = "waiting"       # utterance sent, nothing back yet
    SPEAKING = "speaking"     # at least one sentence arrived
    HANDLED = "handled"       # ovos.utterance.handled: the hub is done
    UNMATCHED = "unmatched"   # no skill/engine understood the utterance
    CANCELLED = "cancelled"   # the hub cancelled the utterance
    TIMED_OUT = "timed_out"   # nothing for `timeout` seconds
    LOST = "lost"             # the connection dropped
    ABORTED = "aborted"       # the caller or shutdown gave up on it

    @property
    def is_final(self) -> bool:
        return self not in (TurnState.WAITING, TurnState.SPEAKING)


@dataclass(frozen=True)
class Sentence:
    text: str


@dataclass(frozen=True)
class Ended:
    state: TurnState
    reason: str = ""


Event = Union[Sentence, Ended]


@dataclass
class Turn:
    """One utterance and its answer. The deadline rolls forward on every sentence."""
    session_id: str
    tag: str
    timeout: float
    started_at: float
    state: TurnState = TurnState.WAITING
    sentences: List[str] = field(default_factory=list)
    deadline: float = 0.0
    speak_type: Optional[str] = None     # first speak topic seen; the other name is a duplicate

    def __post_init__(self):
        self.deadline = self.started_at + self.timeout

    def receive(self, reply: Reply, now: float) -> List[Event]:
        if self.state.is_final:
            return []
        if reply.kind is ReplyKind.SPEAK:
            if self.speak_type is None:
                self.speak_type = reply.msg_type
            elif reply.msg_type != self.speak_type:
                return []   # newer OVOS emits both "speak" and "ovos.utterance.speak"
            self.state = TurnState.SPEAKING
            self.deadline = now + self.timeout
            if not reply.utterance.strip():
                return []
            self.sentences.append(reply.utterance)
            return [Sentence(reply.utterance)]
        if reply.kind is ReplyKind.HANDLED:
            return self._end(TurnState.HANDLED)
        if reply.kind is ReplyKind.UNMATCHED:
            return self._end(TurnState.UNMATCHED, "the hub found no skill for this utterance")
        if reply.kind is ReplyKind.CANCELLED:
            return self._end(TurnState.CANCELLED, "the hub cancelled this utterance")
        return []

    def expire(self, now: float) -> List[Event]:
        if self.state.is_final or now < self.deadline:
            return []
        return self._end(TurnState.TIMED_OUT, f"no reply for {self.timeout:g} s")

    def lose(self, reason: str) -> List[Event]:
        return [] if self.state.is_final else self._end(TurnState.LOST, reason)

    def abort(self, reason: str) -> List[Event]:
        return [] if self.state.is_final else self._end(TurnState.ABORTED, reason)

    def _end(self, state: TurnState, reason: str = "") -> List[Event]:
        self.state = state
        return [Ended(state, reason)]


class TurnTable:
    """Routes replies to the active turn of their session.

    Keyed by session_id, so one connection may carry one session (a 4.0 hub) or many (a hub that
    multiplexes sessions) with the same code. A reply is accepted when its session has an active
    turn and, if the reply carries a turn tag, the tag is that turn's. An untagged end-of-turn
    message that trails a turn ended early (failure, cancel) is swallowed instead of ending the
    next turn of that session.
    """

    def __init__(self):
        self._active: Dict[str, Turn] = {}
        self._trailing_handled: Dict[str, int] = {}

    def open(self, turn: Turn) -> None:
        if turn.session_id in self._active:
            raise RuntimeError(f"session {turn.session_id} already has a turn in progress")
        self._active[turn.session_id] = turn

    def close(self, turn: Turn) -> None:
        if self._active.get(turn.session_id) is turn:
            del self._active[turn.session_id]
        if turn.state in (TurnState.UNMATCHED, TurnState.CANCELLED):
            # the hub still owes ovos.utterance.handled for this utterance
            self._trailing_handled[turn.session_id] = \
                self._trailing_handled.get(turn.session_id, 0) + 1

    def active(self, session_id: str) -> Optional[Turn]:
        return self._active.get(session_id)

    def turns(self) -> List[Turn]:
        return list(self._active.values())

    def route(self, reply: Reply, now: float) -> Tuple[Optional[Turn], List[Event], str]:
        """Return (turn, events, "") when the reply belongs to a turn, else (None, [], why)."""
        turn = self._active.get(reply.session_id)
        if reply.turn_tag is not None:
            if turn is None or reply.turn_tag != turn.tag:
                if reply.kind is ReplyKind.HANDLED:
                    self._pay_trailing(reply.session_id)
                return None, [], f"{reply.msg_type} of an earlier turn"
        elif reply.kind is ReplyKind.HANDLED and self._trailing_handled.get(reply.session_id):
            self._pay_trailing(reply.session_id)
            return None, [], "end of a turn that already ended early"
        if turn is None:
            return None, [], f"{reply.msg_type} for session {reply.session_id} with no turn"
        return turn, turn.receive(reply, now), ""

    def _pay_trailing(self, session_id: str) -> None:
        owed = self._trailing_handled.get(session_id, 0)
        if owed <= 1:
            self._trailing_handled.pop(session_id, None)
        else:
            self._trailing_handled[session_id] = owed - 1
