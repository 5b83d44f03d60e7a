"""The one clock everything that waits goes through, so timing is testable without sleeping.

Production code gets `background.SYSTEM_CLOCK` (monotonic time, real sleeps, timer threads);
tests pass `tests/fake_clock.FakeClock`, whose time moves only when a test advances it and
which runs what is due, in order, as it does.
"""
from typing import Any, Callable, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for `seconds`."""

    def call_later(self, delay: float, action: Callable[[], Any]) -> Callable[[], None]:
        """Run `action` once, `delay` seconds from now, on a thread of the clock's; returns a
        function that cancels it if it has not run yet."""

    def wait(self, condition: Any, timeout: float) -> bool:
        """`condition.wait(timeout)` (the caller holds the condition's lock)."""
