"""Against a genuine OVOS hub of each generation (tests/ovos_hub.py): ovos-core 2.1.1 and real
skills behind hivemind-core 4.0.0 and our plugin's OVOS mode (the stock plugin 0.1.0 of that
line garbles a satellite's stream under load: ovos_hub.sound_agent), and ovos-core 3.7.5a1
behind hivemind-core 5.3.10a1 and the stock plugin 0.5.3a1. Their behaviour is the
specification: audio end, follow-up questions, speech between turns, the hub's own pipeline.

Skills used: hello-world ("hello world" speaks with wait=True), alerts ("set an alarm" asks for
the time with get_response), parrot ("start parrot" converses: it repeats what follows), the
unknown fallback.
"""
import contextlib
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from ovos_hub import RESPONSE_WINDOW, OVOSHub, greetings_at_once, sound_agent, timed, warm_up
from waiting import hold_still, wait_until

from hivemind_chat_agent.bridges.cli import main as cli_main  # noqa: F401  (the CLI imports cleanly)


@pytest.fixture(scope="module")
def ovos(generation):
    hub = OVOSHub(generation=generation, agent=sound_agent(generation)).start()
    yield hub
    hub.cleanup()


@pytest.fixture(scope="module")
def ovos_creds(ovos):
    creds = ovos.add_client()
    warm_up(creds)
    return creds


def test_a_greeting_that_waits_for_audio_end_answers_at_once(ovos_creds, make_agent):
    """hello-world speaks with wait=True: without our audio_output_end it blocks for 15 s."""
    agent = make_agent(ovos_creds.agent_config())
    for i in range(3):
        answer, took = timed(agent, "hello world", f"greet-{i}")
        assert answer == "Hello world"
        assert took < 2.0, f"greeting took {took:.2f} s"


def test_a_caller_that_plays_audio_reports_its_end_and_the_skill_waits_for_it(ovos_creds,
                                                                            make_agent):
    agent = make_agent(ovos_creds.agent_config(plays_audio=True))
    start = time.monotonic()
    turn = agent.stream_sentences([{"role": "user", "content": "hello world"}],
                                  session_id="player")
    assert next(turn) == "Hello world"
    first = time.monotonic() - start
    threading.Timer(1.5, agent.report_audio_end, args=("player",)).start()
    assert list(turn) == []                          # the turn ends once the skill goes on
    took = time.monotonic() - start
    assert first < 2.0 and 1.4 < took < 4.0, (first, took)


def test_a_follow_up_question_and_its_answer_each_end_at_once(ovos_creds, make_agent,
                                                             warnings_of_ours):
    agent = make_agent(ovos_creds.agent_config())
    for round_ in range(2):
        question, took_q = timed(agent, "set an alarm", "alarm")
        assert "time" in question.lower(), question
        answer, took_a = timed(agent, "in five hours", "alarm")   # fires long after the tests
        assert "alarm is set for" in answer.lower() and "five hours" in answer, answer
        # ovos-core 3.7's alerts spends 2-13 s over its first question (it loads its parsers;
        # 13 s in one loaded CI run): the first round only must not hit our 30 s timeout, the
        # second, warm one must end at once (a missing audio end alone would cost 15 s)
        assert took_q < (3.0 if round_ else 25.0) and took_a < 3.0, (took_q, took_a)
    assert warnings_of_ours == []


def test_an_abandoned_question_speaks_out_of_turn_and_never_holds_up_the_next_turn(
        ovos_creds, make_agent):
    agent = make_agent(ovos_creds.agent_config())
    heard = []
    sub = agent.subscribe("abandon", callback=heard.append)
    question, _ = timed(agent, "set an alarm", "abandon")
    assert "time" in question.lower()
    asked = time.monotonic()
    # nobody answers: alerts re-asks once, then gives up, between turns
    late, deadline = [], asked + RESPONSE_WINDOW * 3 + 10
    while not any("didn't hear" in s.lower() for s in late) and time.monotonic() < deadline:
        sentence = sub.get(timeout=max(0.0, deadline - time.monotonic()))
        if sentence is not None:
            late.append(sentence)
    assert any("didn't hear" in s.lower() for s in late), late
    answer, took = timed(agent, "hello world", "abandon")
    assert answer == "Hello world" and took < 2.0
    assert wait_until(lambda: heard == late, 5), (heard, late)   # the callback saw the same
    sub.close()


def test_an_unrelated_utterance_while_a_question_is_open_is_answered_not_timed_out(
        ovos_creds, make_agent):
    """ovos-core hands the next utterance to the waiting get_response, whatever it says: the
    skill's reply (a re-ask, or its giving up) ends that turn, never our timeout."""
    agent = make_agent(ovos_creds.agent_config(timeout=20))
    timed(agent, "set an alarm", "change")
    answer, took = timed(agent, "hello world", "change")
    assert took < 3.0, f"{took:.2f} s: {answer!r}"
    assert answer
    # the user cancels the question: the skill may say nothing at all, and the turn still
    # ends when ovos-core is done with it (the asking utterance's handled)
    answer, took = timed(agent, "cancel", "change")
    assert took < 3.0, f"cancel took {took:.2f} s: {answer!r}"
    answer, took = timed(agent, "hello world", "change")
    assert answer == "Hello world" and took < 3.0


def test_six_parallel_greetings_do_not_slow_another_session(ovos_creds, make_agent):
    agent = make_agent(ovos_creds.agent_config())
    for sid in [f"par-{i}" for i in range(6)] + ["other"]:
        timed(agent, "hello world", sid)     # connected first: this measures turns, not churn

    def other_session():     # once the six greetings are under way
        wait_until(lambda: {f"par-{i}" for i in range(6)} <= agent.sessions_in_use("other"), 5)
        return timed(agent, "start parrot", "other")
    results, other = greetings_at_once(agent, [f"par-{i}" for i in range(6)],
                                       meanwhile=other_session, join=30)
    assert all(a == "Hello world" and took < 3.0 for a, took in results.values()), results
    assert other[1] < 3.0, other
    timed(agent, "stop parrot", "other")


def test_parallel_first_turns_connect_and_answer(ovos_creds, make_agent):
    """New sessions connecting at once, then greeting at once: the stock plugin 0.1.0 loses
    its OVOS bus when clients connect while it forwards, and ovos-core's 6 handler threads all
    block in wait=True before the first audio end is handled (7-15 s) unless turns are spaced."""
    agent = make_agent(ovos_creds.agent_config())
    results, _ = greetings_at_once(agent, [f"first-{i}" for i in range(6)])
    assert all(a == "Hello world" and took < 3.0 for a, took in results.values()), results


def test_the_hubs_pipeline_is_used_not_the_clients(ovos, ovos_creds, make_agent):
    """A client Session built from local defaults names matchers this hub lacks; ovos-core
    logs each one. We send none, so the hub's configured pipeline decides."""
    offset = ovos.log_size("core")
    agent = make_agent(ovos_creds.agent_config())
    assert timed(agent, "hello world", "pipeline")[0] == "Hello world"
    assert timed(agent, "start parrot", "pipeline")[0]
    assert timed(agent, "stop parrot", "pipeline")[0]
    assert timed(agent, "blorp the frobnicator", "pipeline")[0]   # the unknown fallback
    log = ovos.log_since("core", offset)
    assert not [line for line in log.splitlines() if "Unknown pipeline matcher" in line]


def cli(creds, *args, state):
    env = {**os.environ, "XDG_STATE_HOME": state}
    return subprocess.run(
        [sys.executable, "-m", "hivemind_chat_agent.bridges.cli", "--host", creds.host,
         "--port", str(creds.port), "--key", creds.key, "--password", creds.password,
         "--json", *args], env=env, capture_output=True, text=True, timeout=120)


def sentences(result):
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return [line["text"] for line in lines if line["type"] == "sentence"]


def test_a_cli_conversation_continues_across_one_shot_runs(ovos_creds, tmp_path):
    """Parrot repeats what follows "start parrot" only when the next turn's Session says it is
    active: the second process must send what the first one learned."""
    state = str(tmp_path / "state")
    first = cli(ovos_creds, "--session", "parrot-cli", "start parrot", state=state)
    assert first.returncode == 0, first.stderr
    assert sentences(first)
    second = cli(ovos_creds, "--session", "parrot-cli", "purple elephants dance",
                 state=state)
    assert second.returncode == 0, second.stderr
    assert sentences(second) == ["purple elephants dance"]
    stopped = cli(ovos_creds, "--session", "parrot-cli", "stop parrot", state=state)
    assert stopped.returncode == 0
    # without the store, the same second turn is not parroted
    fresh = cli(ovos_creds, "--session", "parrot-cli-2", "start parrot", "--no-store",
                state=state)
    assert fresh.returncode == 0
    again = cli(ovos_creds, "--session", "parrot-cli-2", "purple elephants dance",
                "--no-store", state=state)
    assert sentences(again) != ["purple elephants dance"]


def test_turn_handles_report_answered_and_asked(ovos_creds, make_agent):
    """What a voice loop acts on: a question reopens the microphone (asked), an answer not."""
    from hivemind_chat_agent import TurnStatus
    agent = make_agent(ovos_creds.agent_config(timeout=30))
    hello = agent.begin([{"role": "user", "content": "hello world"}], session_id="t-status")
    assert hello.full_response(timeout=30) == "Hello world"
    assert hello.status is TurnStatus.ANSWERED and not hello.expect_response
    question = agent.begin([{"role": "user", "content": "set an alarm"}],
                           session_id="t-status")
    assert "time" in question.full_response(timeout=30).lower()
    assert question.status is TurnStatus.ASKED and question.expect_response
    assert question.get_snapshot()["expect_response"] is True
    cancel = agent.begin([{"role": "user", "content": "cancel"}], session_id="t-status")
    cancel.full_response(timeout=30)
    assert cancel.status.is_final and not cancel.expect_response


def test_barge_in_stops_a_genuine_skill_mid_answer(ovos_creds, make_agent):
    """ovos-skill-count speaks one number a second and stops per session on `mycroft.stop`,
    answering `<skill>.stop.response` with our turn's tag: the hub's answering side stopped."""
    from hivemind_chat_agent import TurnStatus
    agent = make_agent(ovos_creds.agent_config(timeout=30))
    heard = []
    sub = agent.subscribe("t-barge", callback=heard.append)
    # ovos-padatious 2.x may still be compiling the count intent: on a fresh machine it came
    # minutes after "ready" (a clean-clone run got "Sorry, I don't understand." for 40 s)
    said = []

    def counting():
        turn = agent.begin([{"role": "user", "content": "count to 30"}], session_id="t-barge")
        said.append(next(iter(turn), ""))
        if said[-1].lower() in ("one", "1"):
            return turn
        turn.full_response(timeout=30)
        return None
    turn = wait_until(counting, 300, poll=2)
    assert turn is not None, said[-3:]
    start = time.monotonic()
    turn.terminate()
    assert turn.status is TurnStatus.CANCELLED and time.monotonic() - start < 1.0
    wait_until(lambda: turn.get_snapshot()["hub_stopped_at"] is not None, 5)
    assert turn.get_snapshot()["hub_stopped_at"] is not None, turn.get_snapshot()
    answer, took = timed(agent, "hello world", "t-barge")
    assert answer == "Hello world" and took < 3.0
    hold_still(8)                 # counting would have gone on, a number a second
    assert heard == [], heard
    sub.close()


@contextlib.contextmanager
def hub_logs_on_failure(ovos, chars=6000):
    """A failure inside the block carries what the hub's processes logged meanwhile (the end of
    each, as notes of the exception): the hub's home goes with the module, and a rare failure
    (one in a whole suite's run) without its logs cannot be traced to its cause."""
    offsets = {name: ovos.log_size(name) for name in ("hivemind", "core")}
    try:
        yield
    except BaseException as failure:
        for name, offset in offsets.items():
            failure.add_note(f"--- the hub's {name} log meanwhile (its last {chars} chars) ---\n"
                             + ovos.log_since(name, offset)[-chars:])
        raise


def test_home_assistant_through_wyoming_greets_and_asks_over_two_transcripts(ovos, ovos_creds,
                                                                          make_agent):
    """Assist's turns as Home Assistant sends them (one connection each): a skill's question is
    answered by the next transcript of that conversation, and another conversation meanwhile
    is its own session."""
    from home_assistant import Server, turn
    from wyoming.handle import Handled
    server = Server(make_agent(ovos_creds.agent_config(timeout=30)))
    try:
        with hub_logs_on_failure(ovos):
            hello = turn(server.port, "hello world", conversation_id="ha-greet")
            assert isinstance(hello, Handled) and hello.text == "Hello world"
            question = turn(server.port, "set an alarm", conversation_id="ha-alarm")
            assert isinstance(question, Handled) and "time" in question.text.lower(), question
            other = turn(server.port, "hello world", conversation_id="ha-other")
            assert other.text == "Hello world"          # not taken as the alarm's time
            answer = turn(server.port, "in five hours", conversation_id="ha-alarm")
            assert isinstance(answer, Handled), answer
            assert "alarm is set for" in answer.text.lower() and "five hours" in answer.text
    finally:
        server.stop()


def test_spare_connections_greet_at_once_on_a_genuine_hub(ovos, ovos_creds, make_agent):
    """Spares (4.x: handshaken, HELLO when claimed) behind the stock plugin and ovos-core: a
    claimed spare's session is the one the skills see, and new sessions answer at once."""
    agent = make_agent(ovos_creds.agent_config(spare_connections=2))
    agent.warm_up()
    if agent.pool.sharing is False:
        agent.pool.spares.settle(20)
    ready = {id(conn) for conn in agent.pool.spares.ready()}
    results, _ = greetings_at_once(agent, ["spare-a", "spare-b"])
    assert all(a == "Hello world" and took < 3.0 for a, took in results.values()), results
    if agent.pool.sharing is False:          # 4.x: each greeted over a claimed spare
        assert len(ready) == 2
        assert {id(agent.pool.peek(sid)) for sid in ("spare-a", "spare-b")} == ready
    with hub_logs_on_failure(ovos):
        question, _ = timed(agent, "set an alarm", "spare-a")      # its own session goes on
        assert "time" in question.lower(), question
        answer, _ = timed(agent, "in five hours", "spare-a")
        assert "alarm is set for" in answer.lower(), answer
