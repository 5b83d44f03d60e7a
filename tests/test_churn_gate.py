"""ChurnGate: connects/closes kept apart from turns in flight, bounded; bursts of turns spaced.
On a fake clock: a test holds the gate with an ExitStack and lets a scheduled action release it,
as another thread would."""
from contextlib import ExitStack

from fake_clock import FakeClock

from hivemind_chat_agent.client.churn_gate import ChurnGate


def test_a_connect_waits_for_turns_in_flight_but_never_longer_than_a_turn_can_take():
    """A connect once went after max_wait (1 s) whatever was in flight: on a busy CI machine
    greetings took longer, and the stock 4.0 plugin met the client table changing under them
    (tests/test_real_ovos.py's Home Assistant load). The turns in flight end by their own
    timeout (`turns_last`), and no new turn starts meanwhile."""
    clock = FakeClock()
    gate = ChurnGate(max_wait=0.3, clock=clock, turns_last=5.0)
    with gate.turn():                       # a turn that never ends by itself
        start = clock.now()
        with gate.change():
            assert round(clock.now() - start, 6) == 5.0   # bounded: it cannot hold connects forever
    start = clock.now()
    with gate.change():                     # no turn in flight: at once
        assert clock.now() == start


def waited_behind(held: str, waiting: str, released_after: float,
                  changes_last: float = 0.0, turns_last: float = 0.0) -> float:
    """How long `gate.<waiting>()` waits while `gate.<held>()` is held and released
    `released_after` seconds later, as another thread would."""
    clock = FakeClock()
    gate = ChurnGate(max_wait=1.0, clock=clock, changes_last=changes_last,
                     turns_last=turns_last)
    with ExitStack() as holder:
        holder.enter_context(getattr(gate, held)())
        clock.call_later(released_after, holder.close)
        start = clock.now()
        with getattr(gate, waiting)():
            return round(clock.now() - start, 6)


def test_a_connect_goes_as_soon_as_the_turns_in_flight_end():
    assert waited_behind("turn", "change", 0.1) == 0.1
    # a turn longer than max_wait (1 s): not at 1 s, not at turns_last, when it ends
    assert waited_behind("turn", "change", 2.0, turns_last=30.0) == 2.0


def test_a_turn_waits_for_a_connect_in_progress():
    assert waited_behind("change", "turn", 0.2) == 0.2


def test_a_turn_waits_for_a_slow_connect_as_long_as_connects_may_take():
    """20 parallel 4.0 handshakes took 2 s on a loaded machine: a turn let go after max_wait
    (1 s) met the hub's client table still changing (the stock plugin's Home Assistant load,
    benchmarks/bench_ha_load.py)."""
    assert waited_behind("change", "turn", 2.0, changes_last=12.0) == 2.0
    assert waited_behind("change", "turn", 20.0, changes_last=12.0) == 12.0   # still bounded
    assert waited_behind("turn", "change", 2.0, changes_last=12.0) == 1.0     # max_wait


def test_turns_beyond_the_cap_wait_for_one_to_end():
    clock = FakeClock()
    gate = ChurnGate(max_wait=1.0, stagger=0.0, clock=clock, changes_last=12.0, max_in_flight=2)
    with ExitStack() as in_flight:
        in_flight.enter_context(gate.turn())
        in_flight.enter_context(gate.turn())
        clock.call_later(0.4, in_flight.close)     # both end 0.4 s later
        start = clock.now()
        with gate.turn():                           # the third waits for them
            assert round(clock.now() - start, 6) == 0.4
    gate.relax()
    with ExitStack() as in_flight:                 # relaxed: no cap
        for _ in range(5):
            in_flight.enter_context(gate.turn())


def test_concurrent_turns_are_spaced_and_sequential_ones_never_delayed():
    clock = FakeClock()
    gate = ChurnGate(max_wait=1.0, stagger=0.05, clock=clock)
    start = clock.now()
    for _ in range(5):
        with gate.turn():
            pass
    assert clock.now() == start
    starts = []
    with ExitStack() as in_flight:
        for _ in range(4):
            in_flight.enter_context(gate.turn())
            starts.append(round(clock.now() - start, 6))
    assert starts == [0.0, 0.05, 0.1, 0.15]


def test_zero_disables_the_guard():
    clock = FakeClock()
    gate = ChurnGate(max_wait=0, stagger=0, clock=clock)
    with gate.turn():
        start = clock.now()
        with gate.change():
            assert clock.now() == start


def test_a_relaxed_gate_neither_spaces_nor_waits():
    clock = FakeClock()
    gate = ChurnGate(max_wait=1.0, stagger=0.2, clock=clock)
    gate.relax()
    start = clock.now()
    with gate.turn():
        with gate.turn():          # would be spaced 0.2 s
            with gate.change():    # would wait up to 1 s for the turns in flight
                pass
    assert clock.now() == start
