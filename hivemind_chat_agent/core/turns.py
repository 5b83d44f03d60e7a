"""Turn tracking without I/O: which reply belongs to which turn, and when a turn is over.

`TurnTable.route(reply)` is the single place where a reply from the hub is matched to its turn.
A `Turn` is an explicit state machine (WAITING -> SPEAKING -> one terminal state) that takes
replies and clock readings in and gives `Sentence`/`Ended` events out; the connection layer only
moves bytes and delivers those events. Nothing here touches a socket, a thread or the clock.
"""
from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional, Union

from hivemind_chat_agent.core.replies import Reply, ReplyKind


class Progress(str, Enum):
    """How far the hub's replies have taken a turn (what the caller sees is
    core/outcomes.TurnStatus, judged from the end of this)."""
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
        return self not in (Progress.WAITING, Progress.SPEAKING)


@dataclass(frozen=True)
class Sentence:
    text: str


class EndReason(str, Enum):
    """Why a turn ended without its answer, in one vocabulary for both sides: what a hub
    running our plugin puts in a failure's `data.reason`, and what the client saw itself."""
    NONE = ""                        # an ordinary end, or a reason from a hub we do not know
    # a hub running hivemind-chat-agent-plugin says these
    BUSY = "busy"                    # its queues are full
    ENGINE_ERROR = "engine_error"    # its chat engine raised
    TIMEOUT = "timeout"              # its chat engine went silent
    NO_TEXT = "no_text"              # the utterance had no text
    NOT_UNDERSTOOD = "not_understood"
    STORE_UNAVAILABLE = "store_unavailable"   # its conversation store (Redis) is down
    ID_TOO_LONG = "id_too_long"      # a session or turn id over core/limits.MAX_ID_BYTES
                                     # (or not UTF-8: a lone surrogate)
    BACKEND_UNAVAILABLE = "backend_unavailable"   # OVOS mode: its messagebus is unreachable
    DRAINING = "draining"            # it is shutting down: the turn never ran (send it elsewhere)
    # the client sees these (a LOST turn)
    TOO_LARGE = "too_large"          # a frame over max_frame_bytes: the connection is closed
    TAMPERED = "tampered"            # a frame failed authentication: the connection is closed
    REFUSED = "refused"              # the hub refused this client (key, policy)
    # the hub never read the utterance: an MQTT session the hub had dropped took it
    # (core/mqtt_link.py); the turn is sent again on a new session, on any hub
    UNSENT = "unsent"

    @classmethod
    def read(cls, value: object) -> "EndReason":
        try:
            return cls(value or "")
        except ValueError:
            return cls.NONE


@dataclass(frozen=True)
class Ended:
    state: Progress
    reason: str = ""                     # for people: what happened
    kind: EndReason = EndReason.NONE     # for code: which of the known ends it was


Event = Union[Sentence, Ended]


@dataclass
class Turn:
    """One utterance and its answer. The deadline rolls forward on every sentence. It counts
    the sentences it gave out (`spoken`) but keeps none: they are the caller's, held once, by
    whatever the events are handed to (client/chat_turn.ChatTurn)."""
    session_id: str
    tag: str
    timeout: float
    started_at: float
    state: Progress = Progress.WAITING
    spoken: int = 0                      # sentences given out as events so far
    deadline: float = 0.0
    speak_type: Optional[str] = None     # first speak topic seen; the other name is a duplicate
    answers: Optional[str] = None        # tag of the question this utterance was taken to answer

    def __post_init__(self) -> None:
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
            self.state = Progress.SPEAKING
            self.deadline = now + self.timeout
            events: List[Event] = []
            if reply.utterance.strip():
                self.spoken += 1
                events.append(Sentence(reply.utterance))
            if reply.expect_response:
                events += self._end(Progress.ASKED, "the hub waits for the user's answer")
            return events
        if reply.kind is ReplyKind.UNMATCHED:
            self.state = Progress.UNMATCHED
            return [Ended(Progress.UNMATCHED,
                          reply.detail or "the hub found no skill for this utterance",
                          EndReason.read(reply.reason))]
        if reply.kind is ReplyKind.CANCELLED:
            return self._end(Progress.CANCELLED, "the hub cancelled this utterance")
        return []

    def handled(self) -> List[Event]:
        return [] if self.state.is_final else self._end(Progress.HANDLED)

    def expire(self, now: float) -> List[Event]:
        if self.state.is_final or now < self.deadline:
            return []
        return self._end(Progress.TIMED_OUT, f"no reply for {self.timeout:g} s")

    def lose(self, reason: str, kind: EndReason = EndReason.NONE) -> List[Event]:
        if self.state.is_final:
            return []
        self.state = Progress.LOST
        return [Ended(Progress.LOST, reason, kind)]

    def abort(self, reason: str) -> List[Event]:
        return [] if self.state.is_final else self._end(Progress.ABORTED, reason)

    def _end(self, state: Progress, reason: str = "") -> List[Event]:
        self.state = state
        return [Ended(state, reason)]


class Absorb(str, Enum):
    """How much of the Session a reply carries may be stored for the next turn."""
    NOTHING = "nothing"
    ALL = "all"                       # a reply of the running turn: the newest state there is
    RESPONSE_MODE = "response_mode"   # a still-running earlier handler (a skill's question)
    # may only say whether it is still listening: the rest of its Session is older than ours


@dataclass
class Routing:
    """What one reply means: events for the running turn, a sentence spoken outside any turn,
    how much of its Session to keep, or why it is ignored."""
    turn: Optional[Turn] = None
    events: List[Event] = field(default_factory=list)
    aside: Optional[str] = None        # a sentence for the session's subscribers
    absorb: Absorb = Absorb.NOTHING
    ignored: str = ""


@dataclass
class _Conversation:
    """Per-session routing state. `owed` holds the turn tags whose `ovos.utterance.handled` may
    still come (oldest first, bounded); `questions` maps a skill waiting in get_response() to
    the tag of the utterance that made it ask; `unheard` those of them that have not said they
    listen yet, to when they asked."""
    active: Optional[Turn] = None
    owed: List[str] = field(default_factory=list)
    questions: Dict[str, str] = field(default_factory=dict)
    unheard: Dict[str, float] = field(default_factory=dict)
    stopped: List[str] = field(default_factory=list)   # tags of turns the caller stopped

    @property
    def idle(self) -> bool:
        return self.active is None and not self.owed and not self.questions


class TurnTable:
    """Routes replies to the running turn of their session, as a genuine ovos-core sends them.

    Keyed by session_id, so one connection may carry one session (a 4.0 hub) or many (a hub that
    multiplexes sessions) with the same code. What ovos-core sends, and how it is read:

    * a turn ends on its own `ovos.utterance.handled` (or a failure, a cancel, a question);
    * a question (`speak` with expect_response) ends the asking turn; the skill keeps running.
      If it listens with get_response(), ovos-core hands the user's next utterance to it
      (`<skill>.converse.get_response`, tagged with that utterance, which never gets a
      `handled` of its own); the skill's reply is tagged with the *asking* utterance, and the
      asking utterance's `handled` ends the answering turn;
    * the next turn of a session with a question open waits (`listening_by`) until the
      asking skill says it listens (`<skill>.get_response.waiting`), at most `LISTEN_WITHIN`
      after it asked: ovos-workshop gives up on an answer handed over before then;
    * speech tagged with an utterance that is not the running turn's (a late reply, an alarm, an
      abandoned question giving up) is spoken outside any turn: it goes to the subscribers;
    * replies without our tag (a hub that drops context) belong to the running turn.
    """

    MAX_OWED = 16   # per session; a hub that never sends `handled` must not grow us
    # how long after its question a skill may take to say it listens: it starts listening once
    # the question is spoken (our audio end; past 0.5 s on a loaded hub), 47-54 ms on an idle
    # one; a skill of an ovos-workshop that never says so costs a quick answer this much
    LISTEN_WITHIN = 2.0

    def __init__(self) -> None:
        self._convs: Dict[str, _Conversation] = {}

    def open(self, turn: Turn) -> None:
        conv = self._convs.setdefault(turn.session_id, _Conversation())
        if conv.active is not None:
            raise RuntimeError(f"session {turn.session_id} already has a turn in progress")
        conv.active = turn
        conv.owed.append(turn.tag)
        del conv.owed[:-self.MAX_OWED]

    def close(self, turn: Turn, stopped: bool = False) -> None:
        """The turn is over for the caller. `stopped` (barge-in): what the hub still says
        under its tag is dropped, not spoken between turns."""
        conv = self._convs.get(turn.session_id)
        if conv is not None and conv.active is turn:
            conv.active = None
            if stopped:
                conv.stopped.append(turn.tag)
                del conv.stopped[:-self.MAX_OWED]
            self._forget_if_idle(turn.session_id)

    def owed(self, session_id: str) -> List[str]:
        conv = self._convs.get(session_id)
        return list(conv.owed) if conv else []

    def sessions(self) -> List[str]:
        return list(self._convs)

    def listening_by(self, session_id: str) -> Optional[float]:
        """When the session's next utterance may go: None at once (no question open, or each
        asking skill listens), else the time by which they should listen. An utterance sent
        while a question is open goes to the asking skill whatever it says, and one that
        arrives before the skill listens is taken and then lost (core/protocol_names.py)."""
        conv = self._convs.get(session_id)
        if conv is None or not conv.unheard:
            return None
        return max(conv.unheard.values()) + self.LISTEN_WITHIN

    def route(self, reply: Reply, now: float) -> Routing:
        sid, tag, kind = reply.session_id, reply.turn_tag, reply.kind
        conv = self._convs.get(sid)
        turn = conv.active if conv else None
        if kind is ReplyKind.QUESTION_OPEN:
            if conv is not None and reply.skill_id and tag in conv.owed:
                conv.questions[reply.skill_id] = tag
                conv.unheard[reply.skill_id] = now
        elif kind is ReplyKind.QUESTION_LISTENING and conv is not None:
            conv.unheard.pop(reply.skill_id, None)
        mine = turn is not None and (tag is None or tag == turn.tag or
                                     (turn.answers is not None and tag == turn.answers))
        earlier = conv is not None and tag is not None and tag in conv.owed and not mine
        if kind is ReplyKind.HANDLED:
            paid = tag if tag is not None else (conv.owed[0] if conv and conv.owed else None)
            return self._handled(sid, conv, turn, paid)
        if mine and conv is not None and turn is not None:   # (mine: both are)
            if kind is ReplyKind.ANSWER_TAKEN and tag in (None, turn.tag):
                self._answer_taken(conv, turn, reply.skill_id)
            return Routing(turn, turn.receive(reply, now), absorb=Absorb.ALL)
        aside = reply.utterance if kind is ReplyKind.SPEAK and reply.utterance.strip() else None
        if aside is not None and conv is not None and tag in conv.stopped:
            aside = None    # the caller stopped that answer: the rest of it is not wanted
        if earlier:
            return Routing(aside=aside, absorb=Absorb.RESPONSE_MODE)
        if tag is None and conv is None and aside is None:
            return Routing(ignored=f"{reply.msg_type} for session {sid} between turns")
        if aside is not None:   # an alarm, or speech of a turn that gave up long ago
            return Routing(aside=aside)
        return Routing(ignored=f"{reply.msg_type} of an earlier or stopped turn")

    def _handled(self, sid: str, conv: Optional[_Conversation], turn: Optional[Turn],
                 paid: Optional[str]) -> Routing:
        """Pays the utterance's debt; ends the running turn if it was its own, or the question's
        its answer was waiting for. Untagged, it pays the oldest debt (a hub that drops context
        still answers utterances in order)."""
        if conv is None or paid is None or paid not in conv.owed:
            return Routing(ignored="ovos.utterance.handled with no utterance waiting for it")
        paying = [paid]
        if turn is not None and turn.answers is not None and paid in (turn.tag, turn.answers):
            # an answer taken by a question ends on whichever of the two utterances ovos-core
            # closes: the question's (ovos-core 2.x) or the answer's own (3.x); never both
            paying = [turn.tag, turn.answers]
        for tag in paying:
            if tag in conv.owed:
                conv.owed.remove(tag)
            for skill, asked in list(conv.questions.items()):
                if asked == tag:
                    del conv.questions[skill]
                    conv.unheard.pop(skill, None)
        if turn is not None and paid in (turn.tag, turn.answers):
            return Routing(turn, turn.handled(), absorb=Absorb.ALL)
        self._forget_if_idle(sid)
        return Routing(absorb=Absorb.RESPONSE_MODE)

    @staticmethod
    def _answer_taken(conv: _Conversation, turn: Turn, skill_id: str) -> None:
        """This utterance answers a question: it ends with the asking utterance's `handled`
        (ovos-core 2.x sends none for the answer) or with its own (3.x sends none for the
        question)."""
        asked = conv.questions.get(skill_id)
        if asked is None:   # no announcement seen: the latest earlier utterance still running
            earlier = [t for t in conv.owed if t != turn.tag]
            asked = earlier[-1] if earlier else None
        if asked is None:
            return          # nothing to wait for: the turn ends on its own `handled`
        turn.answers = asked   # its own tag stays owed: ovos-core 3.x closes the answer itself

    def _forget_if_idle(self, sid: str) -> None:
        conv = self._convs.get(sid)
        if conv is not None and conv.idle:
            del self._convs[sid]
