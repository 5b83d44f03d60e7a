"""How each utterance of the OVOS mode ended, for the hub's metrics (docs/metrics.md), decided
without I/O from what the routes see go by.

The chat mode counts a turn where it ends (hub/hub_turn.py); the OVOS mode has no turn object:
an utterance is in flight at ovos-core from the moment the sender thread wrote it until its
`ovos.utterance.handled` (or the `get_response` hand-over that stands for one) comes back
under its Session, and core/ovos_routes.OvosRoutes keeps the send times. This object keeps,
per session, what the metrics need besides: whether the oldest utterance in flight has spoken
yet (its first sentence is timed once) and what its end will count as (`asked` when a
sentence expected a response, `not_understood` when OVOS said it matched no intent, else
`answered`). Utterances forgotten unhandled count as `timed_out` (in_flight_timeout passed)
or `stopped` (their satellite left). Refusals and utterances lost with the bus are counted by
the shell, where their failure is sent (hub/ovos_mode.py).

`metrics` is anything with hub/metrics.NoMetrics' `first_sentence(seconds)` and
`turn_ended(outcome, seconds)`; calls come under the routes' lock and must not block.
"""
from typing import Any, Dict, Optional

from hivemind_chat_agent.core.health import ANSWERED, ASKED, NOT_UNDERSTOOD
from hivemind_chat_agent.core.protocol_names import SPEAK_TYPES, UNMATCHED_TYPES


class UtteranceOutcomes:
    def __init__(self, metrics: Any = None):
        self.metrics = metrics
        self._spoke: Dict[str, bool] = {}   # session id -> its oldest utterance has spoken
        self._hint: Dict[str, str] = {}     # session id -> what that utterance's end counts as

    def seen(self, sid: str, msg_type: str, data: Any, sent_at: float, now: float) -> None:
        """A bus message for session `sid`, whose oldest utterance in flight was sent at
        `sent_at`."""
        if self.metrics is None:
            return
        if msg_type in SPEAK_TYPES:
            if not self._spoke.get(sid):
                self._spoke[sid] = True
                self.metrics.first_sentence(now - sent_at)
            if isinstance(data, dict) and data.get("expect_response"):
                self._hint[sid] = ASKED
        elif msg_type in UNMATCHED_TYPES:
            self._hint[sid] = NOT_UNDERSTOOD

    def ended(self, sid: str, sent_at: float, now: float, outcome: Optional[str] = None) -> None:
        """The oldest utterance of `sid` in flight ended (handled, unless `outcome` says)."""
        if self.metrics is None:
            return
        hint = self._hint.pop(sid, ANSWERED)
        self._spoke.pop(sid, None)
        self.metrics.turn_ended(outcome or hint, max(0.0, now - sent_at))

    def forget(self, sid: str) -> None:
        self._spoke.pop(sid, None)
        self._hint.pop(sid, None)
