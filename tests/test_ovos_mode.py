"""Our plugin in OVOS mode (`"mode": "ovos"`) in front of a genuine ovos-core, on each hub
generation (tests/ovos_hub.py with agent="ovos-mode": ovos-core 2.1.1 behind hivemind-core
4.0.0, ovos-core 3.7.5a1 behind 5.3.10a1), driven by our client as tests/test_real_ovos.py
drives the stock plugin: what a real ovos-core does for satellites must keep working through
it (audio ends, get_response, speech between turns, stop), satellites stay apart, and a
messagebus that goes away is a typed failure, then works again once it is back."""
import time

import pytest
from ovos_hub import RESPONSE_WINDOW, OVOSHub, greetings_at_once, timed, warm_up
from satellite_process import run_satellite
from waiting import hold_still, wait_until

from hivemind_chat_agent import TurnStatus
from hivemind_chat_agent.errors import HubBackendUnavailableError
from hivemind_chat_agent.hub.bus_socket import lacks_quickack, route_to

pytestmark = pytest.mark.hub


@pytest.fixture(scope="module")
def ovos_mode(generation):
    hub = OVOSHub(generation=generation, agent="ovos-mode").start()
    yield hub
    hub.cleanup()


@pytest.fixture(scope="module")
def ovos_mode_creds(ovos_mode):
    creds = ovos_mode.add_client()
    warm_up(creds)
    return creds


def test_a_greeting_that_waits_for_audio_end_answers_at_once(ovos_mode_creds, make_agent):
    """hello-world speaks with wait=True: our audio_output_end must reach ovos-core through
    the plugin, or each greeting blocks for 15 s."""
    agent = make_agent(ovos_mode_creds.agent_config())
    for i in range(3):
        answer, took = timed(agent, "hello world", f"greet-{i}")
        assert answer == "Hello world"
        assert took < 2.0, f"greeting took {took:.2f} s"


def test_a_follow_up_question_and_its_answer_each_end_at_once(ovos_mode_creds, make_agent,
                                                             warnings_of_ours):
    agent = make_agent(ovos_mode_creds.agent_config())
    for round_ in range(2):
        question, took_q = timed(agent, "set an alarm", "alarm")
        assert "time" in question.lower(), question
        answer, took_a = timed(agent, "in five hours", "alarm")
        assert "alarm is set for" in answer.lower() and "five hours" in answer, answer
        assert took_q < (3.0 if round_ else 25.0) and took_a < 3.0, (took_q, took_a)
    assert warnings_of_ours == []


def test_speech_between_turns_reaches_the_sessions_satellite(ovos_mode_creds, make_agent):
    """An abandoned question: alerts re-asks, then gives up, with no turn open."""
    agent = make_agent(ovos_mode_creds.agent_config())
    heard = []
    sub = agent.subscribe("abandon", callback=heard.append)
    question, _ = timed(agent, "set an alarm", "abandon")
    assert "time" in question.lower()
    late, deadline = [], time.monotonic() + RESPONSE_WINDOW * 3 + 10
    while not any("didn't hear" in s.lower() for s in late) and time.monotonic() < deadline:
        sentence = sub.get(timeout=max(0.0, deadline - time.monotonic()))
        if sentence is not None:
            late.append(sentence)
    assert any("didn't hear" in s.lower() for s in late), late
    answer, took = timed(agent, "hello world", "abandon")
    assert answer == "Hello world" and took < 2.0
    assert wait_until(lambda: heard == late, 5), (heard, late)
    sub.close()


def test_barge_in_stops_a_genuine_skill_mid_answer(ovos_mode_creds, make_agent):
    """mycroft.stop reaches ovos-core under the satellite's session: count stops, and its
    stop response comes back to the turn that asked."""
    agent = make_agent(ovos_mode_creds.agent_config(timeout=30))
    heard = []
    sub = agent.subscribe("t-barge", callback=heard.append)
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


def test_two_satellites_with_the_same_session_id_never_see_each_others_replies(
        ovos_mode, ovos_mode_creds, make_agent):
    """Two devices (processes: each client keeps its Sessions process-wide) with their own
    access keys declare the same session id. The stock plugin hands OVOS that id as it is (on
    4.0): one satellite's "hello world" would answer the other's open question. Here each has
    its own OVOS Session and hears only its own answers."""
    first = make_agent(ovos_mode_creds.agent_config())
    second = ovos_mode.add_client(name="second-satellite")
    heard = []
    sub = first.subscribe("shared", callback=heard.append)
    question, _ = timed(first, "set an alarm", "shared")
    assert "time" in question.lower(), question
    # not taken as the alarm's time, and nothing of the alarm reaches the second device
    assert run_satellite(second, "shared", "hello world") == ["Hello world"]
    answer, _ = timed(first, "in five hours", "shared")
    assert "alarm is set for" in answer.lower() and "five hours" in answer, answer
    hold_still(1)
    # alerts may re-ask between turns if the second device took longer than its window (its
    # own speech, for this session); the second device's greeting is never among it
    assert not any("hello" in sentence.lower() for sentence in heard), heard
    sub.close()


def test_parallel_greetings_of_many_sessions_all_answer(ovos_mode_creds, make_agent):
    agent = make_agent(ovos_mode_creds.agent_config())
    results, _ = greetings_at_once(agent, [f"par-{i}" for i in range(6)])
    assert all(a == "Hello world" and took < 3.0 for a, took in results.values()), results


def test_home_assistant_load_loses_no_greeting_through_the_ovos_mode(ovos_mode, ovos_mode_creds,
                                                                    make_agent):
    """tests/test_home_assistant_load.py's load (Home Assistant's flows through the Wyoming
    front: 20 new conversations one after another, 20 at once, 40 more turns) through the OVOS
    mode and a genuine ovos-core's hello-world (which speaks with wait=True), a CPU burner
    occupying one core meanwhile: every greeting answered, no race in the hub's log."""
    from cpu_burner import cpu_burner
    from home_assistant import Server, load_phases
    server = Server(make_agent(ovos_mode_creds.agent_config()))
    offset = ovos_mode.log_size("hivemind")
    try:
        with cpu_burner():
            lost = load_phases(server.port, "mode-load", lambda phase, i: "hello world",
                               lambda said, reply: "hello" in reply.lower(), read_timeout=120)
    finally:
        server.stop()
    lines = ovos_mode.log_since("hivemind", offset).splitlines()
    assert lost == [], [line for line in lines if "ERROR" in line][-20:]
    assert not [line for line in lines if "dictionary changed size" in line
                or "AssertionError" in line or "Traceback" in line], \
        [line for line in lines if "ERROR" in line or "Traceback" in line][-20:]


def test_ovos_unreachable_is_a_typed_failure_and_works_again_once_it_is_back(
        ovos_mode, ovos_mode_creds, make_agent):
    """Last in the module: it stops the messagebus. While it is down a turn fails at once
    with the hub's reason (not a timeout); once it is back, turns are answered again."""
    agent = make_agent(ovos_mode_creds.agent_config(timeout=20))
    assert timed(agent, "hello world", "outage")[0] == "Hello world"
    ovos_mode.stop_messagebus()
    try:
        def refused():
            start = time.monotonic()
            try:
                agent.get_response("hello world", session_id="outage")
            except HubBackendUnavailableError:
                return time.monotonic() - start
            return None
        took = wait_until(refused, 30, poll=0.5)    # the plugin sees the close at once
        assert took is not None and took < 2.0, took
    finally:
        ovos_mode.restart_messagebus()

    prompt = make_agent(ovos_mode_creds.agent_config(timeout=8))

    def answered():
        try:
            return prompt.get_response("hello world", session_id="outage-2") == "Hello world"
        except HubBackendUnavailableError:
            # the bus is back before ovos-core is: refused at once until its skills answer
            # mycroft.skills.is_ready (core/skills_readiness.py), never forwarded to nobody
            # (before, that utterance was lost: TurnTimeoutError after the whole timeout)
            return False
    # ovos-core's own bus client reconnects with a backoff of its own (5 s and up)
    assert wait_until(answered, 120, poll=1)
    answer, took = timed(agent, "hello world", "outage")
    assert answer == "Hello world" and took < 2.0


def test_a_query_is_answered_by_ovos_core_as_the_stock_plugin_answers_it(ovos_mode,
                                                                         generation, tmp_path):
    """hivemind-core 5.x's QUERY (hivemind-bus-client's own satellite sends it): ovos-core's
    skill answers under a Session of the query's own, the sentence comes back as the QUERY's
    answer and the stream ends. hello-world speaks with wait=True: the plugin reports the
    sentence played, or the answer would end only after the skill's 15 s."""
    if generation != "5":
        pytest.skip("hivemind-core answers QUERY through the agent plugin from 4.6.0a1 on")
    from test_hub_v5 import Satellite
    sat = Satellite(ovos_mode.add_client(name="query-satellite"), str(tmp_path))
    try:
        for _ in range(2):
            assert sat.query("hello world") == [("speak", "Hello world"),
                                                ("hive.query.complete", None)]
    finally:
        sat.close()


def test_the_hub_log_says_when_this_machines_route_will_delay_ovos_cores_acks(ovos_mode,
                                                                               ovos_mode_creds):
    """Said once at the bus connection when the loopback route lacks `quickack` (then every
    turn may wait 40 ms for ovos-core's delayed ACKs: docs/troubleshooting.md), and not when
    the operator set it: this machine's real route decides which."""
    expected = lacks_quickack(route_to("127.0.0.1"))

    def said():
        with open(ovos_mode.log_path("hivemind")) as log:
            return log.read().count("the route to it has no quickack")
    if expected:
        assert wait_until(lambda: said() == 1)      # looked at on a thread of its own
    hold_still()
    assert said() == (1 if expected else 0)
