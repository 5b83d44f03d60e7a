"""config/persona.json drives a genuine ovos-persona `Persona` whose answers come from a real hub.

ovos-persona 0.9.0a25 is the newest release that installs beside the pinned stack; from 0.9.0a26
on it needs ovos-workshop>=9.8.1a1, which needs ovos-utils>=0.13.3a2. Since 0.9 a persona's
"handlers" may be ovos-plugin-manager ChatEngines (`opm.agents.chat`), not only solvers.
"""
import json
import os
import uuid

import pytest
from ovos_bus_client.session import Session
from ovos_persona import Persona

from hivemind_chat_agent import HiveMindChatAgent

PERSONA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "config", "persona.json")
PLUGIN = "hivemind-chat-agent"


def shipped_definition():
    with open(PERSONA_FILE) as f:
        return json.load(f)


@pytest.fixture
def persona(creds):
    """The shipped definition with only the hub's address and credentials replaced."""
    definition = shipped_definition()
    definition[PLUGIN].update(creds.agent_config())
    p = Persona(definition["name"], definition)
    yield p
    p.solvers.shutdown()   # closes the agent's connections and threads


def ask(persona, utterance, sess):
    """One turn through the Persona, as PersonaService.query builds it."""
    answer = persona.chat(persona.get_messages(utterance, sess), sess)
    # Persona swallows a handler's exception and answers None: surface it
    assert answer is not None, f"persona gave no answer: {persona.solvers.last_error!r}"
    return answer


def new_session(**kwargs):
    return Session(session_id=f"persona-{uuid.uuid4().hex[:8]}", **kwargs)


def test_shipped_definition_has_placeholders_and_only_the_hivemind_backend():
    definition = shipped_definition()
    assert definition["name"] == "HiveMind Remote"
    assert definition["handlers"] == [PLUGIN]
    assert definition[PLUGIN]["host"] == "127.0.0.1"
    assert definition[PLUGIN]["port"] == 5678
    assert definition[PLUGIN]["key"] == "YOUR_ACCESS_KEY"
    assert definition[PLUGIN]["password"] == "YOUR_PASSWORD"


def test_persona_loads_the_chat_engine_by_plugin_name(persona):
    assert list(persona.solvers.loaded_modules) == [PLUGIN]
    engine = persona.solvers.loaded_modules[PLUGIN]
    assert isinstance(engine, HiveMindChatAgent)
    assert engine.settings.key != "YOUR_ACCESS_KEY"


def test_persona_answers_through_the_hub(persona):
    sess = new_session()
    assert ask(persona, "hello", sess) == "hello there"
    assert ask(persona, "count 2", sess) == "sentence 1\nsentence 2"


def test_persona_streams_each_sentence_from_the_hub(persona):
    sess = new_session()
    assert list(persona.stream(persona.get_messages("count 2", sess), sess)) == \
        ["sentence 1", "sentence 2"]


def test_session_id_and_lang_of_the_persona_session_reach_the_hub(persona):
    sess = new_session(lang="pt-PT")
    assert ask(persona, "whoami", sess) == f"session {sess.session_id}"
    assert ask(persona, "lang", sess) == "language pt-PT"


def test_two_turn_memory_is_kept_per_session_id(persona):
    sess = Session(session_id="persona-memory")
    assert ask(persona, "remember ada", sess) == "I will remember that"
    assert ask(persona, "recall", Session(session_id="persona-memory")) == "you said ada"
    assert ask(persona, "recall", new_session()) == "I remember nothing"
