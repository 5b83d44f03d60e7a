"""The ecosystem's two released A2A clients against `hivemind-chat a2a` (the command itself, a
Bearer key set), in front of the genuine test hubs of both generations (the OVOS-like test
pipeline, tests/pipeline_agent.py: memory in the session, a skill's question), each client in
a venv of its own (tests/hub_venvs.py) and configured as docs/a2a.md shows:

- ovos-a2a-solver-plugin 0.0.4a1 as the handler of a genuine ovos-persona 0.9.0a35 persona
  (tests/a2a_persona.py runs its PersonaService): the persona's answer is the hub's;
- hivemind-a2a-agent-plugin 0.1.6a1 as the agent protocol of a second genuine hivemind-core
  5.3.10a1 hub: its satellites (two of our client and hivemind-bus-client's own, each
  registered with hivemind-core's own CLI) are answered by the first hub through A2A, each
  satellite its own context.

Both plugins in both of their modes: `streaming` true (SendStreamingMessage, artifact updates)
and false (SendMessage, the default: the task's artifacts)."""
import json
import os
import subprocess

import hub_venvs
import pytest
from hubs import HubProcess
from stock_satellite import HANDLED, SPEAK_TYPES, StockSatellite
from test_a2a_server import a2a_command

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "a2a-plugins-test-key"
MODES = [pytest.param(True, id="streaming"), pytest.param(False, id="plain")]


def plugin_settings(url: str, streaming: bool) -> dict:
    """The settings docs/a2a.md gives both plugins (the same four keys)."""
    return {"agent_url": url, "auth_header": f"Bearer {KEY}", "timeout": 60,
            "streaming": streaming}


def persona_answers(folder, url: str, streaming: bool, turns) -> list:
    """What the persona "hub" (a persona file in `folder`, as docs/a2a.md shows it) spoke for
    each (session, utterance) of `turns`, asked in order by one PersonaService."""
    with open(os.path.join(folder, "hub.json"), "w") as f:
        json.dump({"name": "hub", "handlers": ["ovos-a2a-solver"],
                   "ovos-a2a-solver": plugin_settings(url, streaming)}, f)
    python = os.path.join(hub_venvs.ensure_venv("a2a-persona"), "bin", "python")
    asked = [["hub", session, utterance] for session, utterance in turns]
    out = os.path.join(folder, "answers.json")
    proc = subprocess.run([python, os.path.join(HERE, "a2a_persona.py"), str(folder),
                           json.dumps(asked), out], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    with open(out) as f:
        return json.load(f)


@pytest.mark.hub
@pytest.mark.parametrize("streaming", MODES)
def test_an_ovos_persona_is_answered_by_the_hub(creds, make_agent, tmp_path, streaming):
    hub_says = make_agent(creds.agent_config(timeout=10)).get_response(
        "count 3", session_id="the-hub-itself")
    with a2a_command(creds, "--api-key", KEY) as url:
        said = persona_answers(tmp_path, url, streaming, [
            ("kitchen", "count 3"),
            ("kitchen", "remember ada"), ("kitchen", "recall"),   # one session, one context
            ("garage", "recall"),                                  # another session: apart
            ("kitchen", "ask"), ("kitchen", "blue")])              # a skill's question
    assert said[0] == hub_says.split("\n") == ["sentence 1", "sentence 2", "sentence 3"]
    assert said[1:4] == [["I will remember that"], ["you said ada"], ["I remember nothing"]]
    assert said[4] == ["what is your favourite colour?"]
    assert said[5] == ["blue is a fine colour"]


def stock_turn(sat, utterance: str) -> list:
    """What a stock satellite was told for `utterance`: its speaks, up to its one handled."""
    since = sat.mark()
    sat.say(utterance)
    got = sat.until_handled(since=since, timeout=60)
    assert [m["type"] for m in got].count(HANDLED) == 1, (utterance, got)
    return [m["data"].get("utterance") for m in got if m["type"] in SPEAK_TYPES]


@pytest.mark.hub
@pytest.mark.parametrize("streaming", MODES)
def test_a_second_hub_answers_its_satellites_through_a2a(creds, make_agent, streaming):
    with a2a_command(creds, "--api-key", KEY) as url:
        hub = HubProcess({"module": "hivemind-a2a-agent-plugin",
                          "hivemind-a2a-agent-plugin": plugin_settings(url, streaming)},
                         generation="5", venv="a2a-hub-5")
        try:
            hub.start()
            # two satellites of the second hub, both naming the same session
            a = make_agent(hub.add_client().agent_config(timeout=60))
            b = make_agent(hub.add_client().agent_config(timeout=60))
            say = lambda sat, text: sat.get_response(text, session_id="kitchen")  # noqa: E731
            assert say(a, "count 3") == "sentence 1\nsentence 2\nsentence 3"
            assert say(a, "remember ada") == "I will remember that"
            assert say(b, "recall") == "I remember nothing"      # a's context is a's
            assert say(b, "remember bob") == "I will remember that"
            assert say(a, "recall") == "you said ada"
            assert say(b, "recall") == "you said bob"
            assert say(a, "ask") == "what is your favourite colour?"   # a skill's question,
            assert say(a, "blue") == "blue is a fine colour"           # answered by a
            # hivemind-bus-client's own satellite (5.x line), a context of its own too
            stock = StockSatellite("5", hub.add_client(name="stock-sat"), name="stock-sat")
            try:
                assert stock_turn(stock, "recall") == ["I remember nothing"]
                assert stock_turn(stock, "remember cy") == ["I will remember that"]
                assert stock_turn(stock, "recall") == ["you said cy"]
            finally:
                stock.close()
            assert say(a, "recall") == "you said ada"
        finally:
            hub.cleanup()
