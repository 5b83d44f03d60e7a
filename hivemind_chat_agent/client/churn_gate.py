"""Keep connects and closes apart from turns in flight, for a bounded time.

The stock hub plugin of hivemind-core 4.0 (hivemind-ovos-agent-plugin 0.1.0) iterates the hub's
client table on its OVOS bus thread for every message it forwards; a client connecting or
leaving meanwhile raises "dictionary changed size during iteration", and the plugin drops its
OVOS bus connection for seconds, losing every utterance and reply in that window (skills
waiting on a lost `audio_output_end` then hold ovos-core's handler pool). The fix is
upstream (see docs/troubleshooting.md); until a hub has it, an agent never changes its own
connections while its own turns are being answered: a connect or a close waits for the turns in
flight to end, and a new turn waits for connects in progress. Neither side can starve the
other: a turn waits at most as long as a connect or close can take (`changes_last`), and a
connect or close at most as long as a turn can take (`turns_last`, the agent's timeout), while
no new turn starts meanwhile. Connects still run in parallel with each other.

A connect once let go after `max_wait` (1 s) whatever was in flight: on a busy CI machine the
greetings in flight took longer than that, the connect met them, and the stock plugin logged
"dictionary changed size" under Home Assistant's load (tests/test_real_ovos.py); the turns in
flight always end (answered or timed out), so waiting for them is bounded anyway.

"In progress" lasts until the hub has acted, not until our side is done (the pool sets
`HubConnection.acknowledge_changes` while this gate is not relaxed): a HELLO is followed by a
websocket ping, and the connect ends at its pong (tornado handles a connection's frames in
order, so the hub has filed the client by then); a close waits for the hub's answering close
frame (sent as tornado drops the connection): a loaded hub reads the HELLOs of a burst well
after our side has finished them, and without the acknowledgements the first utterances met the
table changing (the figures of the stock plugin's Home Assistant load, benchmarks/bench_ha_load.py:
docs/performance.md#why-the-code-is-as-it-is).

Turns that start while others are in flight are also spaced `stagger` apart (25 ms, about one
round trip through hub and messagebus). ovos-core runs skill handlers on a small pool (6 threads
on 2 cores); a burst of greetings that all speak with wait=True arrives within a few ms of each
other (connects finishing together line them up) and blocks every thread before the first
audio_output_end can be handled (measured: docs/performance.md#why-the-code-is-as-it-is). A lone
turn, or one after the last has ended, is never delayed.

At most `max_in_flight` turns (4) are in flight at once: 25 ms apart is not enough when more
greetings come at once than ovos-core has handler threads (6 on 2 cores): the answers came back
in waves of ovos-core's `wait=True` timeout (every thread waiting for an audio end that no free
thread could handle); a turn past the cap waits for one to end, which leaves two threads for the
audio ends.

Neither hazard exists where the hub answers through our own plugin (hivemind-chat-agent-plugin:
bounded workers, no ovos-core handler pool behind it, a client table read with `dict.get`);
the agent `relax()`es its gate once it hears that plugin speak, so conversations with a
persona or LLM hub start at once.
"""
import threading
from contextlib import contextmanager

from hivemind_chat_agent.background import SYSTEM_CLOCK
from hivemind_chat_agent.core.clock import Clock


class ChurnGate:
    def __init__(self, max_wait: float = 1.0, stagger: float = 0.025,
                 clock: Clock = SYSTEM_CLOCK, changes_last: float = 0.0,
                 max_in_flight: int = 0, turns_last: float = 0.0):
        """`max_wait` (0: the gate is off): the least either side waits for the other.
        `changes_last`: the longest a connect or close can take (its own timeout); a turn
        waits that long for them. `turns_last`: the longest a turn can take (the agent's
        timeout); a connect or close waits that long for the turns in flight. `max_in_flight`
        (0: no cap): turns beyond it wait (as long as for a change) for one to end."""
        self._clock = clock
        self.max_wait = max_wait
        self.changes_last = changes_last
        self.turns_last = turns_last
        self.max_in_flight = max_in_flight
        self.stagger = stagger
        self._next_start = 0.0
        self._cond = threading.Condition()
        self._turns = 0
        self._changes = 0
        self._changes_waiting = 0

    def relax(self) -> None:
        """Neither hazard applies (the hub answers through hivemind-chat-agent-plugin: no
        stock-plugin client table, no ovos-core handler pool behind it): no more waiting or
        spacing for this agent."""
        with self._cond:
            self.max_wait = 0.0
            self.changes_last = 0.0
            self.turns_last = 0.0
            self.max_in_flight = 0
            self.stagger = 0.0
            self._cond.notify_all()

    @contextmanager
    def turn(self):
        """Held while one turn is sent and answered."""
        with self._cond:
            # for as long as connects can take: 20 parallel 4.0 handshakes on a loaded 2-core
            # machine took 2 s, and the first utterances past a 1 s bound met the hub's table
            # still changing (every one of those 20 turns lost)
            self._wait_for(lambda: not self._changes and not self._changes_waiting
                           and not (self.max_in_flight and self._turns >= self.max_in_flight),
                           max(self.max_wait, self.changes_last))
            now = self._clock.now()
            start = max(now, self._next_start) if self._turns else now
            self._next_start = start + self.stagger
            self._turns += 1
        delay = start - self._clock.now()
        if delay > 0:
            self._clock.sleep(delay)
        try:
            yield
        finally:
            with self._cond:
                self._turns -= 1
                self._cond.notify_all()

    @contextmanager
    def change(self):
        """Held while a connection is opened or closed."""
        with self._cond:
            self._changes_waiting += 1
            try:
                self._wait_for(lambda: not self._turns, max(self.max_wait, self.turns_last))
            finally:
                self._changes_waiting -= 1
            self._changes += 1
        try:
            yield
        finally:
            with self._cond:
                self._changes -= 1
                self._cond.notify_all()

    def _wait_for(self, predicate, bound: float) -> None:
        if self.max_wait <= 0:
            return
        deadline = self._clock.now() + bound
        while not predicate():
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                return
            self._clock.wait(self._cond, remaining)
