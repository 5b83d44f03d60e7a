"""How much of the hub's IO loop one satellite connection may use, without I/O.

hivemind-core handles every satellite's frames on one IO loop (per transport), one frame at a
time, in arrival order: decrypting, its own handling and logging, then the agent plugin. A
satellite that sends as fast as it can keeps that loop busy, and another satellite's frame
waits behind the flood's (measured on a 4.0 hub with the OVOS mode: the other's turn 21 ms
without, 4.9-5.2 s during an unpaced flood; docs/performance.md). No queue of the plugin's can
help: the wait is before the plugin sees the frame.

What can help is reading a flooding connection more slowly. Each connection gets an allowance
of loop time: it refills at `share` seconds per second (0.25: a quarter of the loop) up to
`burst` seconds, and the CPU time of every frame's handling and of writing its replies on the
loop's thread is charged to it (CPU, not wall time: on a busy machine wall time grows for every
connection alike, and would pause the innocent). While it is in debt, the
connection's next frame is not read until the debt is repaid (tornado reads a websocket's next
frame only once `on_message`'s awaitable is done): its frames wait in its own socket, and TCP
slows the sender. Nothing is dropped or refused, and a satellite within its share is never
paused.

A refusal puts the connection's next read off too (`hold`, REFUSAL_PAUSE): a satellite that
goes on sending past the plugin's bounds has its excess read, and refused, at a pace the hub
sets, not as fast as it can send. Refusals are what a flood costs the others most
(docs/performance.md, genuine ovos-core behind 5.x): unpaced, 1300 a second slowed the other
satellites' turns more than the flood's answered utterances did; after pauses of 5 ms (about
350 refusals a second) the other's turn met 1.2x in 4 of 9 runs; after 20 ms (about 100 a
second) in 7 of 7, while the flood's utterances reaching OVOS stayed at 5-10 a round either
way. A satellite within its bounds is never refused, so never paused.
"""
from typing import Any, Callable, Mapping, Optional, Tuple

from hivemind_chat_agent.core.protocol_names import CHAT_PLUGIN_NAME
from hivemind_chat_agent.errors import ConfigurationError

DEFAULT_SHARE = 0.25         # of the loop's time, sustained, per connection
DEFAULT_BURST = 1.0          # seconds of loop time a connection may use at once
MAX_PAUSE = 5.0              # the longest a connection's next read is put off at once
REFUSAL_PAUSE = 0.02         # a refused connection's next read is put off this long


class LoopAllowance:
    """One connection's allowance: `charge(spent)` after each frame, then `pause()` says how
    long to wait before reading the next (0.0: at once)."""

    def __init__(self, share: float, burst: float, now: Callable[[], float]):
        if share <= 0 or burst <= 0:
            raise ValueError("share and burst must be > 0")
        self.share, self.burst, self.now = share, burst, now
        self._balance = burst
        self._at = now()
        self._held_until = float("-inf")

    def _refill(self) -> None:
        now = self.now()
        self._balance = min(self.burst, self._balance + (now - self._at) * self.share)
        self._at = now

    def charge(self, spent: float) -> None:
        self._refill()
        self._balance -= max(0.0, spent)

    def hold(self, seconds: float) -> None:
        """Put the next read off by `seconds` at least, whatever the balance."""
        self._held_until = max(self._held_until, self.now() + min(seconds, MAX_PAUSE))

    def pause(self) -> float:
        """Seconds until the balance is back to zero (bounded by MAX_PAUSE) and any hold is
        over, or 0.0."""
        self._refill()
        held = max(0.0, self._held_until - self.now())
        if self._balance >= 0:
            return held
        return max(held, min(MAX_PAUSE, -self._balance / self.share))

    @property
    def balance(self) -> float:
        self._refill()
        return self._balance


def loop_pacing(config: Mapping[str, Any]) -> Optional[Tuple[float, float]]:
    """(share, burst) from the plugin's server.json section (`loop_share`, `loop_burst`), or
    None when `loop_share` is 0 (reads are not paced); ConfigurationError saying what to write."""
    try:
        share = float(config.get("loop_share", DEFAULT_SHARE))
        burst = float(config.get("loop_burst", DEFAULT_BURST))
    except (TypeError, ValueError):
        share = burst = -1.0
    if share == 0:
        return None
    if not (0 < share <= 1) or burst <= 0:
        raise ConfigurationError(
            f'{CHAT_PLUGIN_NAME}: "loop_share" must be a fraction of the IO loop one satellite '
            f'connection may use (0 < share <= 1, default {DEFAULT_SHARE}; 0 turns pacing '
            f'off) and "loop_burst" the seconds of it used at once (> 0, default '
            f"{DEFAULT_BURST})")
    return share, burst
