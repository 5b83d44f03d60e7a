"""What an ended turn means to the caller: its `TurnStatus`, the typed error it raises (if any),
and what becomes of the connection. Pure: the turn's `Ended` event and a few facts in, one
`Outcome` out, so every front (ChatTurn, continue_chat, the CLI, asyncio) reads a turn alike.
"""
from dataclasses import dataclass
from enum import Enum
from typing import Dict, Optional, Tuple, Type

from hivemind_chat_agent.core.turns import Ended, EndReason, Progress
from hivemind_chat_agent.errors import (
    AgentClosedError,
    ConnectionLostError,
    ConversationStoreError,
    HiveMindChatError,
    HubBackendUnavailableError,
    HubBusyError,
    HubDrainingError,
    HubEngineError,
    IdentifierTooLongError,
    ReplyTooLargeError,
    TurnTimeoutError,
)


class TurnStatus(str, Enum):
    """Where a turn stands, as a caller (a voice loop, a web page) acts on it."""
    WAITING = "waiting"                 # sent, nothing back yet
    SPEAKING = "speaking"               # sentences are arriving
    ANSWERED = "answered"               # the hub is done with the utterance
    ASKED = "asked"                     # a skill asked a question: reopen the microphone
    NOT_UNDERSTOOD = "not_understood"   # nothing on the hub understood the utterance
    CANCELLED = "cancelled"             # stopped by the caller (barge-in) or by the hub
    TIMED_OUT = "timed_out"             # the hub went silent for `timeout` seconds
    LOST = "lost"                       # the connection dropped, or the agent shut down
    FAILED = "failed"                   # the hub refused the turn or its engine failed

    @property
    def is_final(self) -> bool:
        return self not in (TurnStatus.WAITING, TurnStatus.SPEAKING)


@dataclass(frozen=True)
class Outcome:
    status: TurnStatus
    error: Optional[HiveMindChatError] = None   # what full_response() raises
    in_step: bool = True        # the connection is still in step with the hub
    lost: bool = False          # the connection is gone: drop it
    reason: str = ""


def judge(event: Ended, *, spoke: bool, refusal: Optional[HiveMindChatError],
          terminated: bool, agent_closed: bool, timeout: float) -> Outcome:
    """`spoke`: some sentence arrived; `refusal`: the hub's typed refusal of this turn;
    `terminated`: the caller stopped it; `agent_closed`: the agent was shut down."""
    state, kind, reason = event.state, event.kind, event.reason
    if state is Progress.HANDLED:
        return Outcome(TurnStatus.ANSWERED, reason=reason)
    if state is Progress.ASKED:
        return Outcome(TurnStatus.ASKED, reason=reason)
    if state is Progress.CANCELLED:
        return Outcome(TurnStatus.CANCELLED, reason=reason)
    if state is Progress.UNMATCHED:
        return _unmatched(kind, reason)
    if terminated and state is Progress.ABORTED:
        return Outcome(TurnStatus.CANCELLED, in_step=False, reason=reason)
    if agent_closed:
        return Outcome(TurnStatus.LOST, AgentClosedError(
            "the agent was shut down during the turn"), in_step=False,
            lost=state is Progress.LOST, reason=reason)
    if state is Progress.TIMED_OUT:
        if spoke:   # what arrived is the answer so far; the caller gets it, with the status
            return Outcome(TurnStatus.TIMED_OUT, in_step=False, reason=reason)
        return Outcome(TurnStatus.TIMED_OUT, TurnTimeoutError(
            f"the hub accepted the utterance but sent no answer within {timeout:g} s; raise "
            "`timeout` or check that the hub's skills or engine are running"), in_step=False,
            reason=reason)
    if state is Progress.LOST and refusal is not None:
        return Outcome(TurnStatus.FAILED, refusal, in_step=False,
                       lost=kind is not EndReason.REFUSED, reason=reason)
    if state is Progress.LOST:
        return _lost(kind, reason)
    # ABORTED by us without a terminate (the reader stopped): the answer is cut short
    return Outcome(TurnStatus.CANCELLED, in_step=False, reason=reason)


_ENGINE_FAILED = ("the hub's chat engine failed on this turn ({reason}); the hub's log has the "
                  "details")
# why the hub ran no turn, or its engine failed on it: the caller's typed error and what it says
_FAILED_UNMATCHED: Dict[EndReason, Tuple[Type[HiveMindChatError], str]] = {
    EndReason.BUSY: (HubBusyError, "the hub is busy ({reason}); try again in a moment"),
    EndReason.DRAINING: (HubDrainingError, "the hub is shutting down and did not run the turn "
                                           "({reason}); try again in a moment"),
    EndReason.STORE_UNAVAILABLE: (ConversationStoreError, "the hub could not reach its "
                                  "conversation store, so the turn was not run ({reason}); try "
                                  "again in a moment"),
    EndReason.ID_TOO_LONG: (IdentifierTooLongError, "the hub refused the turn: {reason}"),
    EndReason.BACKEND_UNAVAILABLE: (HubBackendUnavailableError, "the hub could not reach its "
                                    "OVOS messagebus, so the utterance was not handled "
                                    "({reason}); try again in a moment"),
    EndReason.ENGINE_ERROR: (HubEngineError, _ENGINE_FAILED),
    EndReason.TIMEOUT: (HubEngineError, _ENGINE_FAILED),
}


def _unmatched(kind: EndReason, reason: str) -> Outcome:
    """A turn the hub ended unmatched: its reason (`kind`) says whether the hub refused the
    turn (busy, draining, no store, an id too long, no OVOS bus) or its engine failed, each a
    typed error and the connection out of step; otherwise nothing understood the utterance.
    Of the failures only a draining hub's keeps its `reason` on the Outcome."""
    failed = _FAILED_UNMATCHED.get(kind)
    if failed is None:
        return Outcome(TurnStatus.NOT_UNDERSTOOD, reason=reason)
    error_type, says = failed
    return Outcome(TurnStatus.FAILED, error_type(says.format(reason=reason)), in_step=False,
                   reason=reason if kind is EndReason.DRAINING else "")


def _lost(kind: EndReason, reason: str) -> Outcome:
    """The connection was lost during the turn and no typed refusal of the hub's explains it:
    a reply too large, a tampered frame, or a dropped connection (the answer is lost, the
    session kept). The connection is to be dropped unless `kind` is the hub's REFUSED."""
    if kind is EndReason.TOO_LARGE:
        error: HiveMindChatError = ReplyTooLargeError(reason)
    elif kind is EndReason.TAMPERED:
        error = ConnectionLostError(f"{reason}; the answer was not accepted")
    else:
        error = ConnectionLostError(
            f"{reason}; the answer was lost. The next turn reconnects and the "
            "conversation's session is kept")
    return Outcome(TurnStatus.LOST, error, in_step=False, lost=kind is not EndReason.REFUSED,
                   reason=reason)
