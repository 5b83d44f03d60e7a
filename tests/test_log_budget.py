"""core/log_budget.LogBudget with a hand-moved clock, and the hub's refusal lines through it:
a flood of refused messages from one sender writes a few lines, each refused message is still
answered, and another sender's lines are not held back by it."""
from fake_clock import FakeClock

from hivemind_chat_agent.core.log_budget import LogBudget
from hivemind_chat_agent.hub import refusal_log


def test_a_sender_gets_its_lines_per_window_then_a_count_of_those_left_out():
    clock = FakeClock()
    budget = LogBudget(lines=3, window=60.0, now=clock.now)
    notes = [budget.admit(("failure", "sat-a")) for _ in range(10)]
    assert notes[:2] == ["", ""]
    assert notes[2] is not None and "held back for up to 60 s" in notes[2]
    assert notes[3:] == [None] * 7
    clock.advance(59.0)
    assert budget.admit(("failure", "sat-a")) is None
    clock.advance(1.0)
    note = budget.admit(("failure", "sat-a"))
    assert note == " (8 more like it in the 60 s before were not logged)"
    assert budget.admit(("failure", "sat-a")) == ""


def test_senders_and_kinds_have_allowances_of_their_own():
    clock = FakeClock()
    budget = LogBudget(lines=1, window=60.0, now=clock.now)
    assert budget.admit(("failure", "sat-a")) is not None
    assert budget.admit(("failure", "sat-a")) is None
    assert budget.admit(("failure", "sat-b")) is not None
    assert budget.admit(("unauthenticated", "sat-a")) is not None


def test_made_up_peer_names_cost_bounded_memory():
    clock = FakeClock()
    budget = LogBudget(lines=1, window=60.0, max_keys=100, now=clock.now)
    for i in range(10_000):
        budget.admit(("unauthenticated", f"intruder-{i}"))
    assert len(budget) == 100
    assert budget.admit(("unauthenticated", "intruder-9999")) is None   # the newest are kept


def test_a_flood_of_refusals_writes_a_few_warning_lines(monkeypatch):
    lines = []
    monkeypatch.setattr(refusal_log, "REFUSALS", LogBudget(lines=5, window=60.0))
    monkeypatch.setattr(refusal_log.LOG, "warning", lines.append)
    for i in range(500):
        refusal_log.warn_refusal("failure", "flooder", f"answering flooder with a failure: {i}")
    refusal_log.warn_refusal("failure", "neighbour", "answering neighbour with a failure: x")
    assert len(lines) == 6
    assert lines[-1] == "answering neighbour with a failure: x"


def test_an_answer_outliving_its_satellite_writes_a_few_lines_not_one_per_sentence(monkeypatch):
    """A satellite that left mid-answer: every later sentence is not sent, and said so within
    the budget (over HTTP and websocket one answer gave 30-54 WARNING lines)."""
    from ovos_bus_client.message import Message

    from hivemind_chat_agent.hub.connections import mark_closed
    from hivemind_chat_agent.hub.dialects import send_reply
    lines = []
    monkeypatch.setattr(refusal_log, "REFUSALS", LogBudget(lines=5, window=60.0))
    monkeypatch.setattr(refusal_log.LOG, "warning", lines.append)
    gone = type("Connection", (), {"peer": "sat::gone"})()
    mark_closed(gone)
    for i in range(50):
        send_reply(gone, gone.peer, Message("speak", {"utterance": f"sentence {i}"}))
    assert len(lines) == 5 and all("not sending speak" in line for line in lines), lines
