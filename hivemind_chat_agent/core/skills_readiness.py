"""Whether ovos-core's skills are on the OVOS messagebus, without I/O.

The messagebus and ovos-core are separate processes. When the bus restarts, it is back before
ovos-core's own bus client reconnects (its back-off is 5 s and up); an utterance forwarded in
between reaches nobody, and its satellite waits out its whole timeout for an answer that is
never coming (tests/test_ovos_mode.py had to allow that turn to time out after a bus
restart). The same holds at the hub's start while ovos-core is still loading.

So after every (re)connect the OVOS mode asks ovos-core's skill manager
`mycroft.skills.is_ready` (ovos-utils' ProcessStatus answers it, with `{"status": true}` once
the skills are loaded, in every ovos-core since the Mycroft days) until it says yes. Until then
utterances are refused at once with `backend_unavailable`, saying why, as while the bus is
down: the satellite knows at once, nothing is lost silently.

`SkillsReadiness` takes the events (bus up, bus down, an answer, the time) and says when to
send the next probe and when the skills became ready; the shell sends and reads.
"""
from typing import Any, Dict, Optional

PROBE_TYPE = "mycroft.skills.is_ready"
ANSWER_TYPE = PROBE_TYPE + ".response"
PROBE_SOURCE = "hivemind-chat-agent-plugin"
PROBE_EVERY = 0.5            # seconds between probes while the skills do not answer
WARN_AFTER = 30.0            # seconds unanswered before it is worth a WARNING line
NOT_READY_WHY = ("ovos-core's skills are not on the hub's OVOS messagebus yet (ovos-core is "
                 "starting, or reconnecting after the bus restarted)")


class SkillsReadiness:
    """Down → probing (bus up) → ready (an answer with status true) → down (bus lost)."""

    def __init__(self, every: float = PROBE_EVERY, warn_after: float = WARN_AFTER):
        self.every, self.warn_after = every, warn_after
        self.ready = False
        self._probing_since: Optional[float] = None
        self._next_probe = 0.0
        self._warned = False

    @property
    def probing(self) -> bool:
        return self._probing_since is not None

    def bus_up(self, now: float) -> None:
        self.ready = False
        self._probing_since, self._next_probe, self._warned = now, now, False

    def bus_down(self) -> None:
        self.ready = False
        self._probing_since = None

    def probe_due(self, now: float) -> Optional[Dict[str, Any]]:
        """The probe to send now, or None (not probing, or not yet time)."""
        if not self.probing or now < self._next_probe:
            return None
        self._next_probe = now + self.every
        return {"type": PROBE_TYPE, "data": {},
                "context": {"source": PROBE_SOURCE, "destination": ["skills"]}}

    def seconds_to_next_probe(self, now: float) -> Optional[float]:
        return max(0.0, self._next_probe - now) if self.probing else None

    def overdue(self, now: float) -> bool:
        """True once per outage, when the skills have not answered for `warn_after` s."""
        since = self._probing_since
        if since is None or self._warned or now - since < self.warn_after:
            return False
        self._warned = True
        return True

    def answered(self, message: Dict[str, Any]) -> bool:
        """A bus message that may be the skills' answer; True when it made them ready now."""
        if not self.probing or message.get("type") != ANSWER_TYPE:
            return False
        data = message.get("data")
        if not isinstance(data, dict) or data.get("status") is not True:
            return False
        self.ready = True
        self._probing_since = None
        return True
