"""Satellite connections on probation in the OVOS mode, without I/O: what keeps one satellite's
flood from slowing the others' turns once it has gone over its bounds.

The bounds of core/ovos_routes.py (4 utterances in flight per session, 16 per access key, 32
queued) keep a flooder from piling work onto OVOS, but within them it still keeps OVOS busy
with 4 utterances at once, back to back: another satellite's utterance then waits behind them
in ovos-core's queue, and every process on the way (hub, messagebus, ovos-core) runs the
flood's traffic beside it (docs/performance.md: 2.5x the other's turn on a 5.x hub at the
flood's pace). A satellite that waits for its answers never goes over the bounds; one that was
refused `busy` did, and for `seconds` after that refusal its connection is on probation:

- one utterance of it at OVOS at a time (queued or in flight, all its sessions together);
- none while an utterance of a satellite in good standing (not on probation) is queued or in
  flight: OVOS runs one session's turn beside another's, sharing its CPU, so a flood utterance
  started beside another satellite's turn slows that turn by about half its own length (genuine
  ovos-core behind a 5.x hub: 1.28x the other's turn without this rule);
- after each ends, its next may go only once `1 / share - 1` times as long as that one took
  has passed (`share` 0.25: it keeps OVOS busy a quarter of the time at most, the others get
  the rest);
- anything else it sends meanwhile is refused `busy` at once, as any bound refuses.

Probation is renewed by the bounds' refusals only, not by its own: a flooder is back on it
within moments of coming off, and a satellite refused once by accident is off it after
`seconds`. The hub shell also reads a connection's next frame a little later after each
refusal (core/loop_share.REFUSAL_PAUSE), so the refusals themselves cost little.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional

PROBATION_SECONDS = 2.0      # how long after a bound's refusal a connection is on probation
# the fraction of the time it may keep OVOS busy meanwhile: at 0.5 a flood beside another
# satellite's turns cost them 1.22-1.26x, at 0.25 1.06x (genuine ovos-core behind 5.x,
# docs/performance.md)
PROBATION_SHARE = 0.25


@dataclass
class Term:
    """One connection's probation: until when, and when its next utterance may go."""
    until: float
    free_at: float = float("-inf")


class Probation:
    """The connections on probation, by connection token. The routing table calls it under its
    lock; `open_count` gives the table's own count of the connection's utterances queued or in
    flight (counted there, so that no second count can drift from the table, and only for a
    connection on probation)."""

    def __init__(self, seconds: float = PROBATION_SECONDS, share: float = PROBATION_SHARE):
        if seconds < 0 or not 0 < share <= 1:
            raise ValueError("seconds must be >= 0 and 0 < share <= 1")
        self.seconds, self.share = seconds, share
        self._terms: Dict[str, Term] = {}

    def bound_refused(self, conn: str, now: float) -> None:
        """One of the bounds refused `conn` an utterance: on probation from now."""
        if self.seconds <= 0:
            return
        term = self._terms.get(conn)
        if term is None:
            self._terms[conn] = Term(now + self.seconds)
        else:
            term.until = now + self.seconds

    def on_probation(self, conn: str, now: float) -> bool:
        term = self._terms.get(conn)
        if term is None:
            return False
        if now >= term.until:
            del self._terms[conn]
            return False
        return True

    def refusal(self, conn: str, open_count: Callable[[], int], now: float,
                others_busy: Callable[[], bool]) -> Optional[str]:
        """Why an utterance of `conn` may not go to OVOS now (it is on probation and has one
        there, its turn to wait is not over, or `others_busy()`: a satellite in good standing
        has one there), or None. The callables are asked only for a connection on probation."""
        if not self.on_probation(conn, now):
            return None
        if open_count():
            return ("this satellite went over its bounds and sends one utterance at a time "
                    "for now; one of its is still being handled by OVOS")
        if now < self._terms[conn].free_at:
            return (f"this satellite went over its bounds and may keep OVOS busy "
                    f"{self.share:.0%} of the time for now; try again in a moment")
        if others_busy():
            return ("this satellite went over its bounds and waits for OVOS to be free of "
                    "other satellites' turns for now; try again in a moment")
        return None

    def ended(self, conn: str, sent_at: float, now: float) -> None:
        """An utterance of `conn` sent at `sent_at` ended now: on probation, its next waits
        as long again as this one took (times 1 / share - 1)."""
        term = self._terms.get(conn)
        if term is not None:
            term.free_at = now + max(0.0, now - sent_at) * (1 / self.share - 1)

    def closed(self, conn: str) -> None:
        self._terms.pop(conn, None)

    def __len__(self) -> int:
        return len(self._terms)
