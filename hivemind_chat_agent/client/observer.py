"""What the agent tells whoever watches it (a front's metrics, bridges/front_metrics.py): each
turn's start, first sentence and end, and each reconnect and resend, where they happen.

Sans-I/O and free of any metrics library: `ClientObserver` is a no-op base whose methods a
watcher overrides; `NO_OBSERVER` is what an agent nobody watches calls, so the client core
never imports prometheus_client and pays a method call per event. The calls come from the
turn's own threads (its driver, the caller's thread in `begin`): an observer must not block.

- `turn_began()` once per turn the agent takes (its utterance read), before any wait;
- `first_sentence(seconds)` once per turn that said something, `seconds` after it began;
- `turn_ended(status, seconds)` once per turn begun, however it ends: `status` is its
  core/outcomes.TurnStatus, or None when it failed before it was sent (no connection, a
  refused key, the caller gave up while it waited);
- `reconnected()`: the agent opened a connection for a session whose connection broke (lost
  mid-turn, found dead, or left because its replica was draining);
- `resent(reason)`: a turn was sent again by its id (client/turn_driver's retries): `reason`
  one of RESEND_REASONS.
"""
from typing import Optional

from hivemind_chat_agent.core.outcomes import TurnStatus

LOST, UNSENT, DRAINING = "lost", "unsent", "draining"
RESEND_REASONS = (LOST, UNSENT, DRAINING)


class ClientObserver:
    """Nothing is done with what happens; override what you want to know."""

    def turn_began(self) -> None:
        """A turn was taken (see the module's docstring for each method)."""

    def first_sentence(self, seconds: float) -> None:
        """The turn's first sentence arrived `seconds` after it began."""

    def turn_ended(self, status: Optional[TurnStatus], seconds: float) -> None:
        """A turn begun ended `seconds` after it began; None: it was never sent."""

    def reconnected(self) -> None:
        """A connection was opened in place of one that broke."""

    def resent(self, reason: str) -> None:
        """A turn was sent again (`reason`: lost, unsent, draining)."""


NO_OBSERVER = ClientObserver()

__all__ = ["ClientObserver", "NO_OBSERVER", "RESEND_REASONS", "LOST", "UNSENT", "DRAINING"]
