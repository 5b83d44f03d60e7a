"""Our hub plugin through hivescope, the ecosystem's own E2E library for HiveMind: its MasterNode
(a genuine hivemind-core 5.x HiveMindListenerProtocol) with our ChatAgentProtocol, its
SatelliteNodes (genuine hivemind-bus-client slave protocols) over the Noise handshake, all
in-process and with no IO loop on any thread, as on hivemind-mqtt-protocol's thread. Before
hub/reply_loops.py the plugin wrote through tornado's `IOLoop.current()` there, a loop that
nobody ran: the satellites heard nothing, not even a timeout.

hivescope runs in a venv of its own (tests/hub_venvs.py: installed, it moves XDG_CACHE_HOME for
every pytest session), so the scenarios are tests/hivescope_probe.py, run there once."""
import json
import os
import subprocess

import hub_venvs
import pytest

pytestmark = pytest.mark.hub
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def heard(tmp_path_factory):
    python = hub_venvs.bin_path("hivescope", "python")
    hub_venvs.ensure_venv("hivescope")
    home = tmp_path_factory.mktemp("hivescope-home")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=os.pathsep.join([hub_venvs.package_path(), HERE]),
               XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"))
    run = subprocess.run([python, os.path.join(HERE, "hivescope_probe.py")], env=env,
                         cwd=str(home), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def kinds(events):
    return [kind for kind, _, _ in events]


def said(events):
    return [text for kind, text, _ in events if kind == "speak"]


def test_a_satellite_is_answered_sentence_by_sentence_then_its_turn_ends(heard):
    assert kinds(heard["greeting"]) == ["speak", "speak", "handled"]
    assert said(heard["greeting"]) == ["sentence 1", "sentence 2"]


def test_replies_are_written_off_the_callers_thread_on_the_plugins_own_loop(heard):
    threads = {thread for _, _, thread in heard["greeting"]}
    assert threads == {"hivemind-chat-replies"}, threads
    assert heard["main_thread"] not in threads


def test_each_satellite_keeps_its_own_conversation(heard):
    assert said(heard["remembered"]) == ["I will remember that"]
    assert said(heard["other_satellite"]) == ["I remember nothing"]
    assert said(heard["same_satellite"]) == ["you said the red door"]


def test_a_hung_engine_ends_by_the_plugins_own_timer(heard):
    assert kinds(heard["timed_out"]) == ["failure", "handled"]
    assert heard["timed_out"][0][1] == "timeout"


def test_a_stop_ends_a_long_answer_and_the_next_turn_is_answered(heard):
    assert kinds(heard["talking"])[:1] == ["speak"]
    assert kinds(heard["stopped"])[-1] == "handled"
    assert len(said(heard["stopped"])) < 50
    assert said(heard["after_stop"]) == ["hello there"]
