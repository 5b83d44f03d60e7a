"""Every example in config/ loads and works against real hubs."""
import json
import os
import subprocess
import sys

from hubs import HubProcess

from hivemind_chat_agent import HiveMindChatAgent

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")
CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")


def example(name):
    with open(os.path.join(CONFIG, name)) as f:
        return json.load(f)


def test_server_json_serves_the_local_aiml_engine(generation):
    hub = HubProcess(server_config=example("server.json"), generation=generation).start()
    try:
        agent = HiveMindChatAgent(hub.add_client().agent_config())
        try:
            assert "Ada" in agent.get_response("my name is Ada", session_id="ex")
            assert agent.get_response("what is my name", session_id="ex") == "Your name is Ada."
        finally:
            agent.shutdown()
    finally:
        hub.cleanup()


def test_server_relay_json_relays_to_an_upstream_hub(hub, generation):
    relay = example("server-relay.json")
    upstream = hub.add_client(name="relay-example")
    relay["agent_protocol"]["hivemind-chat-agent-plugin"]["engine_config"].update(
        upstream.agent_config())
    middle = HubProcess(server_config=relay, generation=generation).start()
    try:
        agent = HiveMindChatAgent(middle.add_client().agent_config())
        try:
            assert agent.get_response("count 2", session_id="relayed") == \
                "sentence 1\nsentence 2"
            assert agent.get_response("remember ada", session_id="relayed") == \
                "I will remember that"
            assert agent.get_response("recall", session_id="relayed") == "you said ada"
        finally:
            agent.shutdown()
    finally:
        middle.cleanup()


def test_identity_json_is_what_the_cli_and_agent_use_without_flags(hub, tmp_path):
    # a client of its own: another XDG_CONFIG_HOME means another Noise key, which a 5.x hub
    # refuses for an access key that already pinned one
    creds = hub.add_client()
    identity = example("identity.json")
    identity.update(access_key=creds.key, password=creds.password, default_port=creds.port)
    folder = tmp_path / "config" / "hivemind"
    folder.mkdir(parents=True)
    (folder / "_identity.json").write_text(json.dumps(identity))
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    out = subprocess.run([CLI, "--session", "from-identity", "whoami"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "session from-identity"
