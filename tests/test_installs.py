"""Installs where users run the package, each into a real environment of its own.

- The client (`pip install hivemind-chat-agent`, no extra) beside a stable OVOS (ovos-core 2.1.1
  and its skills, the `ovos-stable` venv of tests/hub_venvs.py; with the documented
  `"ovos-plugin-manager<3"` beside it, which a plain install ignores) and beside a current one
  (ovos-core 3.7 with hivemind-core 5.3, the `ovos-hub-5` venv): OVOS's packages stay as they
  were (only the plugin layer may move up: ovos-plugin-manager 2.2.0 has no ChatEngine),
  `pip check` stays clean, and a persona-style program in that environment loads the agent with
  `load_chat_plugin("hivemind-chat-agent")` and gets its answer from a real hub.
- The client beside ovos-plugin-manager 3.1.0a1 (the `opm3-client` venv, no ovos-core): the
  plugin layer stays at 3.1.0a1, `pip check` clean, OPM 3 finds the agent, a conversation with
  history is answered by a 4.0 and a 5.x hub. A 4.0.0 hub (which, unlike 5.x, declares no
  bound on the plugin layer) with OPM 3.1.0a1: the plugin loads its engine by plugin name.
- `[hub]` into a hivemind-core 5.3 environment: hivemind-core and the rest unchanged, the plugin
  answers under `hivemind-core listen`. On a 4.0.0 hub, the documented `--no-deps` install.
- A command whose extra is missing names it, and importing the package loads no hub library
  and patches nothing.

Each test copies a cached venv (never the cache itself) and installs a wheel of this checkout
into the copy, as pip does for a user: resolving against the index, without constraints.txt.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import hub_venvs
import pytest
from hubs import HubProcess, plugin_config

pytestmark = pytest.mark.hub

# moves up beside ovos-core 2.1.1 because it must: 2.2.0 has no ChatEngine
PLUGIN_LAYER = {"ovos-plugin-manager"}
HUB_LIBRARIES = ("hivemind_core", "hivemind_plugin_manager", "tornado")
# what docs/compatibility.md has a stable-OVOS user add: the client's range lets OPM 3 in, and
# pip does not read the bounds of what is installed already (ovos-core 2.1.1 declares <3), so a
# plain install there takes 3.1.0a1, the newest pre-release
OVOS_2_PLUGIN_LAYER = "ovos-plugin-manager<3"

# what a persona or skill does with the agent: find it among the chat plugins, load it by name,
# ask, ask again. argv: the agent's config, then the turns (each the messages of one
# continue_chat, as [role, content] pairs: history before the last user message)
PERSONA = textwrap.dedent("""
    import json, sys
    from ovos_plugin_manager.agents import find_chat_plugins, load_chat_plugin
    from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
    Agent = load_chat_plugin("hivemind-chat-agent")
    agent = Agent(json.loads(sys.argv[1]))
    try:
        answers = [agent.continue_chat([AgentMessage(MessageRole(r), c) for r, c in turn],
                                       session_id="kitchen").content
                   for turn in json.loads(sys.argv[2])]
    finally:
        agent.shutdown()
    print(json.dumps({"agent": type(agent).__module__, "answers": answers,
                      "found": find_chat_plugins().get("hivemind-chat-agent") is Agent}))
""")


def run(cmd, cwd, timeout=600, **kw):
    """Run outside the checkout and without the caller's PYTHONPATH, so `import
    hivemind_chat_agent` finds the installed copy (a checkout on PYTHONPATH, with the
    egg-info the wheel's build leaves there, would make pip skip the wheel as installed)."""
    kw.setdefault("env", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


def packages(venv: str, cwd: str) -> dict:
    out = run([os.path.join(venv, "bin", "python"), "-m", "pip", "list", "--format=json",
               "--disable-pip-version-check"], cwd)
    assert out.returncode == 0, out.stderr
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out.stdout)}


def pip(venv: str, cwd: str, *args: str) -> subprocess.CompletedProcess:
    return run([os.path.join(venv, "bin", "python"), "-m", "pip", *args,
                "--disable-pip-version-check"], cwd)


def changed(before: dict, after: dict, may_move=frozenset()) -> dict:
    return {name: (version, after.get(name)) for name, version in before.items()
            if after.get(name) != version and name not in may_move}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """This checkout as the wheel pip would build for a user."""
    out_dir = tmp_path_factory.mktemp("wheel")
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-q", "-w", str(out_dir), hub_venvs.CHECKOUT], str(out_dir))
    assert built.returncode == 0, built.stderr[-3000:]
    return str(next(out_dir.glob("hivemind_chat_agent-*.whl")))


class Installed:
    """A copy of a cached venv, with `requirement` (one, or a list for one pip command)
    installed into it by pip."""

    def __init__(self, venv_name, requirement, folder, no_deps=False):
        requirements = [requirement] if isinstance(requirement, str) else list(requirement)
        self.folder = str(folder)
        self.venv = os.path.join(self.folder, "venv")
        shutil.copytree(hub_venvs.ensure_venv(venv_name), self.venv, symlinks=True)
        self.python = os.path.join(self.venv, "bin", "python")
        self.before = packages(self.venv, self.folder)
        self.install = pip(self.venv, self.folder, "install", "-q",
                           *(["--no-deps"] if no_deps else []), *requirements)
        assert self.install.returncode == 0, self.install.stdout + self.install.stderr[-3000:]
        self.after = packages(self.venv, self.folder)
        self.check = pip(self.venv, self.folder, "check")

    def persona_turns(self, creds, turns=([["user", "hello"]], [["user", "hello"]])) -> dict:
        """PERSONA run in this venv against the hub of `creds`: what it printed."""
        out = run([self.python, "-c", PERSONA, json.dumps(creds.agent_config(timeout=20)),
                   json.dumps(turns)], self.folder, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def stable_ovos(wheel, tmp_path_factory):
    return Installed("ovos-stable", [wheel, OVOS_2_PLUGIN_LAYER],
                     tmp_path_factory.mktemp("ovos-stable"))


@pytest.fixture(scope="module")
def current_ovos_hub(wheel, tmp_path_factory):
    return Installed("ovos-hub-5", wheel + "[hub]", tmp_path_factory.mktemp("ovos-hub-5"))


def test_the_client_beside_a_stable_ovos_leaves_its_packages_and_pip_check_clean(stable_ovos):
    assert stable_ovos.before["ovos-core"] == "2.1.1"
    assert stable_ovos.before["ovos-bus-client"] == "1.5.0"
    assert changed(stable_ovos.before, stable_ovos.after, PLUGIN_LAYER) == {}
    assert stable_ovos.check.returncode == 0, stable_ovos.check.stdout
    assert "hivemind-core" not in stable_ovos.after       # a client pulls in no server
    assert "hivemind-plugin-manager" not in stable_ovos.after


def test_a_plain_install_beside_a_stable_ovos_takes_opm_3_which_its_ovos_core_refuses(
        wheel, tmp_path):
    """Why the stable-OVOS line of docs/compatibility.md names `ovos-plugin-manager<3`: without
    it pip moves the plugin layer past what ovos-core 2.1.1 and ovos-padatious declare. When
    this fails, a stable ovos-core takes OPM 3 (or the range changed): update the docs."""
    plain = Installed("ovos-stable", wheel, tmp_path)
    assert plain.after["ovos-plugin-manager"].startswith("3.")
    assert plain.check.returncode != 0
    assert "ovos-core 2.1.1 has requirement ovos-plugin-manager<3" in plain.check.stdout


def test_a_persona_beside_a_stable_ovos_loads_the_agent_and_hears_the_hub(stable_ovos, creds):
    result = stable_ovos.persona_turns(creds)
    assert result == {"agent": "hivemind_chat_agent.client.agent", "found": True,
                      "answers": ["hello there", "hello there"]}


def test_a_command_without_its_extra_names_the_extra_to_install(stable_ovos):
    cli = os.path.join(stable_ovos.venv, "bin", "hivemind-chat")
    for command, extra in (("demo", "demo"), ("wyoming", "wyoming")):
        out = run([cli, command], stable_ovos.folder, timeout=60, stdin=subprocess.DEVNULL)
        assert out.returncode == 2
        assert f'pip install "hivemind-chat-agent[{extra}]"' in out.stdout + out.stderr
        assert "Traceback" not in out.stdout + out.stderr


def test_importing_the_package_loads_no_hub_library_and_patches_nothing(stable_ovos):
    probe = textwrap.dedent(f"""
        import sys
        from hivemind_bus_client import encryption
        codecs = {{n: getattr(encryption, n) for n in ("B91", "Z85B", "Z85P")}}
        import hivemind_chat_agent
        from hivemind_chat_agent import HiveMindChatAgent, Subscription, TurnStatus
        loaded = [m for m in sys.modules if m.split(".")[0] in {HUB_LIBRARIES!r}]
        same = all(getattr(encryption, n) is c for n, c in codecs.items())
        print(loaded, same, Subscription.__name__)
    """)
    # (the test venv's own install: tests/test_extras.py)
    out = run([stable_ovos.python, "-c", probe], stable_ovos.folder, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].split() == ["[]", "True", "Subscription"]


@pytest.fixture(scope="module")
def opm3_client(wheel, tmp_path_factory):
    return Installed("opm3-client", wheel, tmp_path_factory.mktemp("opm3-client"))


def test_the_client_beside_ovos_plugin_manager_3_keeps_it_and_pip_check_clean(opm3_client):
    """setup.py lets the plugin layer's next major in: pip keeps 3.1.0a1 (under a `<3` cap it
    would take it back down to 2.x, or refuse beside an OPM 3 pin) and moves nothing else."""
    assert opm3_client.before["ovos-plugin-manager"] == "3.1.0a1"
    assert "ovos-core" not in opm3_client.before
    assert changed(opm3_client.before, opm3_client.after) == {}
    assert opm3_client.check.returncode == 0, opm3_client.check.stdout
    assert "hivemind-core" not in opm3_client.after


def test_a_persona_on_ovos_plugin_manager_3_finds_the_agent_and_keeps_the_conversation(
        opm3_client, creds):
    """OPM 3's own find_chat_plugins/load_chat_plugin find the engine; a turn with history
    sends the latest user message, and what the hub keeps in the Session carries to the next
    turns (once per hub generation: the `creds` fixture's)."""
    history = [["system", "be nice"], ["user", "first"], ["assistant", "you said first"],
               ["user", "echo this"]]
    result = opm3_client.persona_turns(creds, [history, [["user", "remember ada"]],
                                               [["user", "recall"]]])
    assert result == {"agent": "hivemind_chat_agent.client.agent", "found": True,
                      "answers": ["you said echo this", "I will remember that",
                                  "you said ada"]}


def test_the_hub_extra_beside_ovos_core_3_7_keeps_hivemind_core_and_pip_check_clean(
        current_ovos_hub):
    assert current_ovos_hub.before["hivemind-core"] == "5.3.10a1"
    assert current_ovos_hub.before["ovos-core"].startswith("3.7.")
    assert changed(current_ovos_hub.before, current_ovos_hub.after) == {}
    assert current_ovos_hub.check.returncode == 0, current_ovos_hub.check.stdout


def test_the_installed_plugin_answers_under_hivemind_core_listen(current_ovos_hub):
    hub = HubProcess(plugin_config(), installed_in=current_ovos_hub.venv).start()
    try:
        result = current_ovos_hub.persona_turns(hub.add_client())
    finally:
        hub.cleanup()
    assert result["answers"] == ["hello there", "hello there"]


def test_a_4_0_hub_takes_the_plugin_with_no_deps_and_keeps_its_pins(wheel, tmp_path):
    hub_env = Installed("hub-4.0", wheel, tmp_path, no_deps=True)
    assert hub_env.before["hivemind-core"] == "4.0.0"
    assert changed(hub_env.before, hub_env.after) == {}
    hub = HubProcess(plugin_config(), generation="4.0", installed_in=hub_env.venv).start()
    try:
        creds = hub.add_client()
        from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole

        from hivemind_chat_agent import HiveMindChatAgent
        agent = HiveMindChatAgent(creds.agent_config(timeout=20))
        try:
            answer = agent.continue_chat([AgentMessage(MessageRole.USER, "hello")], "s1")
        finally:
            agent.shutdown()
    finally:
        hub.cleanup()
    assert answer.content == "hello there"


def test_a_4_0_hub_on_opm_3_loads_an_engine_by_its_plugin_name_and_answers(wheel, tmp_path):
    """hivemind-core 4.0.0 declares no bound on the plugin layer (5.3.10a1 declares <3, so a
    5.x hub cannot hold OPM 3): there OPM 3.1.0a1 goes in beside the plugin, moves nothing
    else, and its find_chat_plugins hands the plugin an engine by entry-point name (the
    demo's ALICE bot, `aiml` being pure Python). The plugin goes in with --no-deps, as on
    any 4.0 hub, so pip check lists our client's requirements only."""
    hub_env = Installed("hub-4.0", [wheel, "ovos-plugin-manager==3.1.0a1", "aiml==0.9.2"],
                        tmp_path, no_deps=True)
    assert hub_env.before["hivemind-core"] == "4.0.0"
    assert hub_env.after["ovos-plugin-manager"] == "3.1.0a1"
    assert changed(hub_env.before, hub_env.after, PLUGIN_LAYER) == {}
    complaints = [line for line in hub_env.check.stdout.splitlines()
                  if not line.startswith("hivemind-chat-agent ")]
    assert complaints == [], hub_env.check.stdout
    hub = HubProcess(plugin_config(engine="hivemind-chat-demo-aiml"), generation="4.0",
                     installed_in=hub_env.venv).start()
    try:
        from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole

        from hivemind_chat_agent import HiveMindChatAgent
        agent = HiveMindChatAgent(hub.add_client().agent_config(timeout=30))
        try:
            answers = [agent.continue_chat([AgentMessage(MessageRole.USER, text)], "s1").content
                       for text in ("my name is Ada", "what is my name")]
        finally:
            agent.shutdown()
    finally:
        hub.cleanup()
    assert "Ada" in answers[0] and "Ada" in answers[1], answers
