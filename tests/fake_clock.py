"""A core.clock.Clock whose time moves only when the test says: `advance(dt)` (and `sleep`, and
a `wait` that nothing ends early) runs every action that falls due, in time order."""
import heapq
import itertools


class FakeClock:
    def __init__(self, start: float = 0.0):
        self.time = start
        self._due = []                  # (when, sequence, action, cancelled flag)
        self._sequence = itertools.count()

    def now(self) -> float:
        return self.time

    def call_later(self, delay, action):
        entry = [self.time + max(0.0, delay), next(self._sequence), action, False]
        heapq.heappush(self._due, entry)

        def cancel():
            entry[3] = True
        return cancel

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, running what falls due on the way, each at its
        own time."""
        self._run_until(self.time + seconds)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def wait(self, condition, timeout: float) -> bool:
        """Nothing else runs in a single-threaded test: time moves to the next due action
        (which may notify the waiter) or to the timeout, whichever comes first."""
        deadline = self.time + timeout
        live = [entry for entry in self._due if not entry[3]]
        until = min([deadline] + [entry[0] for entry in live])
        self._run_until(until)
        return until < deadline

    @property
    def pending(self) -> int:
        return sum(1 for entry in self._due if not entry[3])

    def _run_until(self, until: float) -> None:
        while self._due and self._due[0][0] <= until:
            when, _, action, cancelled = heapq.heappop(self._due)
            self.time = max(self.time, when)
            if not cancelled:
                action()
        self.time = max(self.time, until)
