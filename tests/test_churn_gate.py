"""ChurnGate: connects/closes kept apart from turns in flight, bounded; bursts of turns spaced."""
import threading
import time

from hivemind_chat_agent.client.churn_gate import ChurnGate


def test_a_connect_waits_for_turns_in_flight_but_never_longer_than_max_wait():
    gate = ChurnGate(max_wait=0.3)
    entered = threading.Event()
    release = threading.Event()

    def turn():
        with gate.turn():
            entered.set()
            release.wait(2)
    t = threading.Thread(target=turn)
    t.start()
    entered.wait(1)
    start = time.monotonic()
    with gate.change():
        waited = time.monotonic() - start
    assert 0.25 <= waited < 0.6          # bounded: a long turn cannot hold connects forever
    threading.Timer(0.1, release.set).start()
    start = time.monotonic()
    t.join(2)
    with gate.change():
        assert time.monotonic() - start < 0.3


def test_a_turn_waits_for_a_connect_in_progress():
    gate = ChurnGate(max_wait=1.0)
    in_change = threading.Event()

    def connect():
        with gate.change():
            in_change.set()
            time.sleep(0.2)
    threading.Thread(target=connect).start()
    in_change.wait(1)
    start = time.monotonic()
    with gate.turn():
        assert 0.15 <= time.monotonic() - start < 0.6


def test_concurrent_turns_are_spaced_and_sequential_ones_never_delayed():
    gate = ChurnGate(max_wait=1.0, stagger=0.05)
    start = time.monotonic()
    for _ in range(5):
        with gate.turn():
            pass
    assert time.monotonic() - start < 0.04

    starts, hold = [], threading.Event()

    def turn():
        with gate.turn():
            starts.append(time.monotonic())
            hold.wait(2)
    threads = [threading.Thread(target=turn) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 2
    while len(starts) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    hold.set()
    for t in threads:
        t.join(2)
    starts.sort()
    assert len(starts) == 4
    assert all(b - a >= 0.045 for a, b in zip(starts, starts[1:])), starts


def test_zero_disables_the_guard():
    gate = ChurnGate(max_wait=0, stagger=0)
    with gate.turn():
        start = time.monotonic()
        with gate.change():
            assert time.monotonic() - start < 0.05


def test_a_relaxed_gate_neither_spaces_nor_waits():
    gate = ChurnGate(max_wait=1.0, stagger=0.2)
    gate.relax()
    start = time.monotonic()
    with gate.turn():
        with gate.turn():          # would be spaced 0.2 s
            with gate.change():    # would wait up to 1 s for the turns in flight
                pass
    assert time.monotonic() - start < 0.05
