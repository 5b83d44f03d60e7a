"""How the real-hub tests wait: for an event, never for a fixed time in the hope that it passed.

- `wait_until(condition, timeout)` polls `condition` and returns its value as soon as it is
  truthy (a reply arrived, a log line was written, a process exited, a pool emptied), or its
  last value once `timeout` seconds have passed. The timeout is an upper bound that only a
  failing test reaches, so it costs nothing when the test passes.
- `hold_still(units)` is the one wait that cannot end on an event: giving something that must
  NOT happen (a second `ovos.utterance.handled`, a reply to a bystander, a resend) the time it
  would have needed to show. It is measured in `UNIT`s, so a slow machine raises one number
  (HIVEMIND_CHAT_TEST_UNIT, seconds) instead of editing every test.

A test that measures a duration against a real hub (a turn refused "at once", a timeout
that fired "at its time") bounds it by the configured time plus a few UNITs, so the same
number scales those margins. A quick-loop test that measures time drives
tests/fake_clock.FakeClock instead of the wall clock. The scripted engines' and hubs' sleeps
(tests/engines.py, tests/pipeline_agent.py: "slow", "wait", "hang", "later") play a slow
engine, which is the scenario under test, not a wait."""
import os
import time

UNIT = float(os.environ.get("HIVEMIND_CHAT_TEST_UNIT", "0.3"))
"""Seconds in which a local hub on a loaded machine has delivered a frame it was going to
deliver: the scale of every `hold_still`."""

POLL = 0.02
"""Seconds between two looks at a condition: short against UNIT, long against a loop turn."""


def wait_until(condition, timeout: float = 10.0, poll: float = POLL):
    """`condition()`'s first truthy value within `timeout` seconds, else its value at the
    deadline (falsy: the caller's assert says what did not happen)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(poll)


def hold_still(units: float = 1.0) -> None:
    """Let `units` UNITs pass, for an assertion that something did NOT happen meanwhile."""
    time.sleep(units * UNIT)


def accepting(port: int, host: str = "127.0.0.1", connect_timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on `host`:`port` now (a socket state to
    wait for with wait_until)."""
    import socket
    try:
        socket.create_connection((host, port), timeout=connect_timeout).close()
    except OSError:
        return False
    return True
