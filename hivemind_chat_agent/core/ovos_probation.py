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
- after each ends, its next may go only once as long again has passed as that one took
  (`share` 0.5: it keeps OVOS busy half the time at most, the others get the rest);
- anything else it sends meanwhile is refused `busy` at once, as any bound refuses.

Probation is renewed by the bounds' refusals only, not by its own: a flooder is back on it
within moments of coming off, and a satellite refused once by accident is off it after
`seconds`. The hub shell also reads a connection's next frame a little later after each
refusal (core/loop_share.REFUSAL_PAUSE), so the refusals themselves cost little.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional

PROBATION_SECONDS = 2.0      # how long after a bound's refusal a connection is on probation
PROBATION_SHARE = 0.5        # the fraction of the time it may keep OVOS busy meanwhile


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

    def refusal(self, conn: str, open_count: Callable[[], int], now: float) -> Optional[str]:
        """Why an utterance of `conn` may not go to OVOS now (it is on probation and has one
        there, or its turn to wait is not over), or None."""
        if not self.on_probation(conn, now):
            return None
        if open_count():
            return ("this satellite went over its bounds and sends one utterance at a time "
                    "for now; one of its is still being handled by OVOS")
        if now < self._terms[conn].free_at:
            return (f"this satellite went over its bounds and may keep OVOS busy "
                    f"{self.share:.0%} of the time for now; try again in a moment")
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
