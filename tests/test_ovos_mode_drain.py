"""A genuine hub in OVOS mode draining on SIGTERM (issue 27, part 4, for the OVOS mode;
hub/ovos_operations.py), on both generations: hivemind-core with our plugin in front of a
genuine ovos-messagebus and an answering service (tests/stock_hub.py), `health` on. At the
signal `/readyz` says 503 "draining" at once; the utterance ovos-core is answering is answered; our
client's turn sent during the drain is refused with the `draining` reason (with no other hub
to go to it ends HubDrainingError, never run); the process exits 0 once ovos-core handled
what it had. Before that, `/readyz` follows the bus: ovos-messagebus stopped is 503. And with a
genuine ovos-core (tests/ovos_hub.py), a skill still in the middle of its answer at the signal
(hello-world waiting for the satellite's audio to end) finishes it before the hub exits."""
import http.client
import json
import re
import signal
import threading
import time

import pytest
from hubs import free_port
from stock_hub import StockOVOSHub
from waiting import wait_until

from hivemind_chat_agent import HiveMindChatAgent, HubDrainingError

pytestmark = pytest.mark.hub


@pytest.fixture
def ovos_mode_hub(generation):
    health = free_port()
    hub = StockOVOSHub(plugin="ovos-mode", generation=generation,
                       settings={"health": f"127.0.0.1:{health}", "drain_timeout": 15},
                       log_level="INFO")      # the drain's report is an INFO line
    hub.health_port = health
    hub.start()
    yield hub
    hub.cleanup()


def health(port, path):
    """(status, body) of GET `path`, or (None, "") when nothing answers."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return None, ""


def test_sigterm_answers_what_ovos_has_refuses_what_comes_and_exits_cleanly(ovos_mode_hub):
    hub = ovos_mode_hub
    running = HiveMindChatAgent(hub.add_client().agent_config(timeout=20))
    late = HiveMindChatAgent(hub.add_client().agent_config(timeout=8))
    try:
        assert wait_until(lambda: health(hub.health_port, "/readyz")[0] == 200, 30)
        assert late.get_response("hello", session_id="late") == "you said hello"
        turn = running.begin([{"role": "user", "content": "wait 6"}], session_id="busy")
        in_flight = re.compile(r"^hivemind_chat_turns_in_flight 1\.0$", re.M)
        assert wait_until(lambda: in_flight.search(health(hub.health_port, "/metrics")[1]), 5)
        signalled = time.monotonic()
        hub.hub.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: health(hub.health_port, "/readyz")[0] in (503, None), 5,
                          poll=0.01)
        not_ready = time.monotonic() - signalled
        status, body = health(hub.health_port, "/readyz")
        assert status is None or json.loads(body)["reason"] == "draining"
        # sent while ovos-core is still answering the other: refused, and sent again until
        # the hub is gone (its new connections are closed after the drain's handshake grace)
        refused = []
        resending = threading.Thread(target=lambda: refused.append(_ended(late)))
        resending.start()
        assert list(turn) == ["you said wait 6"]
        assert turn.status.value == "answered"
        code = hub.hub.proc.wait(30)
        exited = time.monotonic() - signalled
        resending.join(30)
        assert len(refused) == 1 and isinstance(refused[0], HubDrainingError), refused
    except BaseException:
        print(hub.logs()[-8000:])
        raise
    finally:
        running.shutdown()
        late.shutdown()
    logs = hub.logs()
    drained = re.findall(r"drained in ([0-9.]+) s: (\d+) utterances handled, (\d+) cut at "
                         r"drain_timeout, (\d+) refused, (\d+) connections closed", logs)
    assert drained, logs[-3000:]
    seconds, finished, cut, refusals, closed = drained[-1]
    print(f"{hub.generation}: not ready {not_ready * 1000:.0f} ms after SIGTERM, drained in "
          f"{seconds} s ({finished} handled, {refusals} refused, {closed} closed), exited "
          f"{exited:.2f} s after it with code {code}")
    assert code == 0
    assert (int(finished), int(cut)) == (1, 0) and int(refusals) >= 1
    assert exited < 15


def _ended(agent):
    try:
        return agent.get_response("hello again", session_id="late")
    except Exception as e:       # what the test asserts
        return e


def test_readyz_says_503_while_the_ovos_messagebus_is_gone(ovos_mode_hub):
    hub = ovos_mode_hub
    assert wait_until(lambda: health(hub.health_port, "/readyz")[0] == 200, 30)
    bus, _ = hub.procs[0]                     # ovos-messagebus, started first
    bus.send_signal(signal.SIGKILL)
    bus.wait(10)
    assert wait_until(lambda: health(hub.health_port, "/readyz")[0] == 503, 10)
    status, body = health(hub.health_port, "/readyz")
    assert json.loads(body)["reason"] == "ovos_unavailable", body
    assert health(hub.health_port, "/healthz")[0] == 200      # the process still serves


def test_a_genuine_skill_mid_answer_at_sigterm_finishes_before_the_hub_exits(generation):
    """hello-world speaks with wait=True: with `plays_audio` the skill waits for our audio end,
    so at the SIGTERM ovos-core is in the middle of its answer. The hub stops being ready, stays
    up while the skill waits (seconds), and exits 0 once the audio end let it finish: the turn
    answered, the drain's report one utterance handled, none cut."""
    from ovos_hub import OVOSHub
    port = free_port()
    # on 4.0 hivemind-core from the hub-4.0 venv, which has prometheus_client (the [metrics]
    # extra the health endpoint needs) beside the same hivemind-core 4.0.0
    ovos = OVOSHub(generation, "ovos-mode", hub_venv="hub-4.0" if generation == "4.0" else None,
                   settings={"health": f"127.0.0.1:{port}", "drain_timeout": 20})
    agent = None
    try:
        ovos.start()
        agent = HiveMindChatAgent(ovos.add_client().agent_config(timeout=60, plays_audio=True))
        warm = agent.stream_sentences([{"role": "user", "content": "hello world"}],
                                      session_id="drain-warm")
        assert next(warm) == "Hello world"
        agent.report_audio_end("drain-warm")
        assert list(warm) == []
        assert wait_until(lambda: health(port, "/readyz")[0] == 200, 30)
        turn = agent.begin([{"role": "user", "content": "hello world"}], session_id="drain")
        sentences = iter(turn)
        assert next(sentences) == "Hello world"      # the skill now waits for the audio's end
        hub, _ = ovos.procs["hivemind"]
        hub.send_signal(signal.SIGTERM)
        assert wait_until(lambda: health(port, "/readyz")[0] in (503, None), 5, poll=0.01)
        time.sleep(2)
        assert hub.poll() is None, "the hub left while a skill was still answering"
        agent.report_audio_end("drain")
        assert list(sentences) == [] and turn.status.value == "answered"
        assert hub.wait(30) == 0
    finally:
        if agent is not None:
            agent.shutdown()
        logs = ovos.log_tail("hivemind", 10 ** 7)
        ovos.cleanup()
    drained = re.findall(r"drained in ([0-9.]+) s: (\d+) utterances handled, (\d+) cut at "
                         r"drain_timeout", logs)
    assert drained, logs[-3000:]
    assert drained[-1][1:] == ("1", "0"), drained[-1]
