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
    ASKED = "asked"           # a skill asked a question (expect_response) and waits for the answer
    UNMATCHED = "unmatched"   # no skill/engine understood the utterance
    CANCELLED = "cancelled"   # the hub cancelled the utterance
    TIMED_OUT = "timed_out"   # nothing for `timeout` seconds
    LOST = "lost"             # the connection dropped
    ABORTED = "aborted"       # the caller or shutdown gave up on it

    @property
    def is_final(self) -> bool:
        return self not in (TurnState.WAITING, TurnState.SPEAKING)

    @property
    def in_step(self) -> bool:
        """Ended the way the hub meant it to: the connection is still in step with the hub."""
        return self in (TurnState.HANDLED, TurnState.ASKED, TurnState.UNMATCHED,
                        TurnState.CANCELLED)


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
        """A sentence, a failure or a cancel of this turn (`ovos.utterance.handled` is the
        TurnTable's to judge: it may belong to an earlier utterance of the session)."""
        if self.state.is_final:
            return []
        if reply.kind is ReplyKind.SPEAK:
            if self.speak_type is None:
                self.speak_type = reply.msg_type
            elif reply.msg_type != self.speak_type:
                return []   # newer OVOS emits both "speak" and "ovos.utterance.speak"
            self.state = TurnState.SPEAKING
            self.deadline = now + self.timeout
            events: List[Event] = []
            if reply.utterance.strip():
                self.sentences.append(reply.utterance)
                events.append(Sentence(reply.utterance))
            if reply.expect_response:
                events += self._end(TurnState.ASKED, "the hub waits for the user's answer")
            return events
        if reply.kind is ReplyKind.UNMATCHED:
            return self._end(TurnState.UNMATCHED, "the hub found no skill for this utterance")
        if reply.kind is ReplyKind.CANCELLED:
            return self._end(TurnState.CANCELLED, "the hub cancelled this utterance")
        return []

    def handled(self) -> List[Event]:
        return [] if self.state.is_final else self._end(TurnState.HANDLED)

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
    multiplexes sessions) with the same code.

    The hub answers every utterance with exactly one `ovos.utterance.handled`, but not always
    before the next utterance: after `complete_intent_failure` or a cancel it follows at once,
    and after a skill asks a question (`expect_response`) it only comes once the skill got its
    answer, i.e. during the next turn, after the sentences that answer it. So the table keeps,
    per session, the turn tags of the utterances whose `handled` is still owed, and a turn is
    over when nothing is owed any more. A tagged reply must carry an owed tag (else it is stale);
    an untagged `handled` pays the oldest debt.
    """

    def __init__(self):
        self._active: Dict[str, Turn] = {}
        self._owed: Dict[str, List[str]] = {}

    def open(self, turn: Turn) -> None:
        if turn.session_id in self._active:
            raise RuntimeError(f"session {turn.session_id} already has a turn in progress")
        self._active[turn.session_id] = turn
        self._owed.setdefault(turn.session_id, []).append(turn.tag)

    def close(self, turn: Turn) -> None:
        if self._active.get(turn.session_id) is turn:
            del self._active[turn.session_id]

    def owed(self, session_id: str) -> List[str]:
        return list(self._owed.get(session_id, ()))

    def route(self, reply: Reply, now: float) -> Tuple[Optional[Turn], List[Event], str]:
        """(turn or None, events, "") for a reply of this session's conversation, which may
        refresh its Session; (None, [], why) for one to ignore."""
        sid = reply.session_id
        owed = self._owed.get(sid, [])
        turn = self._active.get(sid)
        if reply.turn_tag is not None and reply.turn_tag not in owed:
            return None, [], f"{reply.msg_type} of an earlier turn"
        if reply.kind is ReplyKind.HANDLED:
            if not owed:
                return None, [], f"{reply.msg_type} with no utterance waiting for it"
            owed.remove(reply.turn_tag if reply.turn_tag is not None else owed[0])
            if not owed:
                del self._owed[sid]
            return turn, (turn.handled() if turn is not None and not owed else []), ""
        if turn is None:
            return None, [], f"{reply.msg_type} for session {sid} between turns"
        if reply.kind in (ReplyKind.UNMATCHED, ReplyKind.CANCELLED) and \
                reply.turn_tag not in (None, turn.tag):
            return None, [], f"{reply.msg_type} of an earlier utterance"
        return turn, turn.receive(reply, now), ""
