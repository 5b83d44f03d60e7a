"""The drain plan of a hub replica told to stop (core/drain.py), without sockets or a clock."""
import pytest

from hivemind_chat_agent.core.drain import Decision, Drain, Phase


def test_serving_admits_turns_and_decides_nothing():
    drain = Drain(timeout=20)
    assert drain.admit("a") and drain.admit("a")
    assert drain.running == 2 and not drain.draining
    assert drain.turn_ended("a", 1.0, ["a"]) == Decision()
    assert drain.tick(2.0, ["a", "b"]) == Decision()


def test_stop_closes_idle_connections_and_keeps_busy_ones_until_their_turn_ends():
    drain = Drain(timeout=20)
    assert drain.admit("busy")
    decision = drain.stop(100.0, ["busy", "idle1", "idle2"])
    assert drain.draining and drain.phase is Phase.DRAINING
    assert decision == Decision(close=frozenset({"idle1", "idle2"}))
    assert drain.tick(101.0, ["busy", "idle1", "idle2"]) == Decision()   # closed once
    assert drain.turn_ended("busy", 103.5, ["busy"]) == \
        Decision(close=frozenset({"busy"}), exit=True, cut=0)
    assert drain.phase is Phase.DONE and drain.over and drain.ended - drain.began == 3.5


def test_a_turn_arriving_during_the_drain_is_refused_and_its_connection_closed():
    drain = Drain(timeout=20)
    assert drain.admit("busy")
    drain.stop(0.0, ["busy"])
    drain.connected("new", 0.5)
    assert not drain.admit("new")                 # refused: it never runs here
    assert drain.running == 1
    # a newcomer is left alone for its handshake's grace, unless it was refused already
    assert drain.tick(1.0, ["busy", "new"]) == Decision()
    assert drain.refused(1.0, ["busy", "new"]) == Decision()
    assert drain.tick(5.5, ["busy", "new"]) == Decision(close=frozenset({"new"}))


def test_the_drain_ends_at_once_when_nothing_runs():
    drain = Drain(timeout=20)
    assert drain.stop(7.0, ["a", "b"]) == Decision(close=frozenset({"a", "b"}), exit=True)
    assert not drain.admit("a")
    assert drain.stop(8.0, []) == Decision()      # a second SIGTERM changes nothing
    assert drain.tick(9.0, ["late"]) == Decision()  # over: the shell exits


def test_the_drain_waits_for_a_newcomer_in_its_grace_before_it_ends():
    drain = Drain(timeout=20, grace=5)
    drain.admit("busy")
    drain.stop(0.0, ["busy"])
    drain.connected("new", 1.0)
    assert drain.turn_ended("busy", 2.0, ["busy", "new"]) == Decision(close=frozenset({"busy"}))
    assert drain.next_tick(2.0) == 1.0
    assert drain.tick(5.9, ["new"]) == Decision()
    assert drain.next_tick(5.9) == pytest.approx(0.1)
    assert drain.tick(6.0, ["new"]) == Decision(close=frozenset({"new"}), exit=True)


def test_turns_still_running_at_the_timeout_are_cut():
    drain = Drain(timeout=20)
    drain.admit("a"), drain.admit("a"), drain.admit("b")
    drain.stop(0.0, ["a", "b"])
    drain.turn_ended("b", 3.0, ["a", "b"])
    assert drain.next_tick(19.5) == 0.5
    assert drain.tick(19.9, ["a", "b"]) == Decision()
    assert drain.tick(20.0, ["a", "b"]) == Decision(close=frozenset({"a"}), exit=True, cut=2)
    assert drain.over and drain.cut == 2


def test_a_connection_that_goes_and_comes_back_under_its_name_is_closed_again():
    drain = Drain(timeout=20)
    drain.admit("x")
    drain.stop(0.0, ["x", "y"])
    drain.disconnected("y")
    drain.connected("y", 1.0)
    assert drain.tick(6.0, ["x", "y"]) == Decision(close=frozenset({"y"}))


def test_a_zero_timeout_ends_at_once_and_a_negative_one_is_refused():
    drain = Drain(timeout=0)
    drain.admit("a")
    assert drain.stop(0.0, ["a"]) == Decision(close=frozenset({"a"}), exit=True, cut=1)
    with pytest.raises(ValueError):
        Drain(timeout=-1)


def test_a_host_list_tries_the_next_hub_first_after_a_draining_refusal():
    import threading

    from hivemind_chat_agent.client.churn_gate import ChurnGate
    from hivemind_chat_agent.client.config import ClientConfig
    from hivemind_chat_agent.client.pool_parts import Connector
    config = ClientConfig.from_dict({"host": ["ws://a.lan:5678", "ws://b.lan:5679"],
                                     "key": "k", "password": "p"})
    opened = []

    class Fake:
        def __init__(self, cfg, session):
            self.config = cfg
            opened.append((cfg.host, cfg.port))

        def connect(self):
            return self
    connector = Connector(config, Fake, ChurnGate(0, stagger=0), threading.Lock())
    first = connector.open(None)
    assert opened == [("a.lan", 5678)]
    connector.draining(first.config)
    connector.open(None)
    assert opened[-1] == ("b.lan", 5679)
    connector.draining(first.config)      # a's news again: b stays first
    connector.open(None)
    assert opened[-1] == ("b.lan", 5679)
