"""Extras without a venv: what a missing one says, and what importing the package loads.
(tests/test_installs.py checks the same in real environments.)"""
import importlib.util
import subprocess
import sys
import textwrap

import pytest

import hivemind_chat_agent
from hivemind_chat_agent.bridges import cli
from hivemind_chat_agent.errors import ConfigurationError, MissingExtraError
from hivemind_chat_agent.extras import EXTRA_MODULES, require


@pytest.fixture
def without(monkeypatch):
    """Make the named top-level modules look uninstalled."""
    def hide(*names):
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name.split(".")[0] in names
                            else real(name, *a))
    return hide


def test_every_extra_is_installed_in_the_test_environment():
    for extra in ("hub", "demo", "wyoming"):
        require(extra, "the test suite")


def test_a_missing_extra_raises_an_import_error_that_names_it(without):
    without("aiml")
    with pytest.raises(MissingExtraError) as raised:
        require("demo", "hivemind-chat demo")
    assert isinstance(raised.value, ImportError) and isinstance(raised.value, ConfigurationError)
    assert str(raised.value) == ('hivemind-chat demo needs the [demo] extra, which is not '
                                 'installed here (missing: aiml): '
                                 'pip install "hivemind-chat-agent[demo]"')


@pytest.mark.parametrize("command,module,extra", [("demo", "hivemind_core", "demo"),
                                                  ("wyoming", "wyoming", "wyoming"),
                                                  ("a2a", "a2a", "a2a")])
def test_a_command_without_its_extra_says_which_to_install(without, capsys, command, module,
                                                            extra):
    without(module)
    assert cli.main([command]) == 2
    out = capsys.readouterr()
    assert f'pip install "hivemind-chat-agent[{extra}]"' in out.out + out.err
    assert "Traceback" not in out.out + out.err


def test_the_hub_plugin_name_without_the_hub_extra_names_it(without, monkeypatch):
    monkeypatch.delitem(vars(hivemind_chat_agent), "ChatAgentProtocol", raising=False)
    without(*EXTRA_MODULES["hub"])
    with pytest.raises(MissingExtraError, match=r'\[hub\]'):
        getattr(hivemind_chat_agent, "ChatAgentProtocol")  # noqa: B009 (the lazy import is the test)


def test_importing_the_package_loads_no_hub_library_and_patches_nothing():
    probe = textwrap.dedent("""
        import sys
        from hivemind_bus_client import encryption
        codecs = {n: getattr(encryption, n) for n in ("B91", "Z85B", "Z85P")}
        import hivemind_chat_agent
        from hivemind_chat_agent import HiveMindChatAgent, Subscription, TurnStatus
        hub = [m for m in sys.modules
               if m.split(".")[0] in ("hivemind_core", "hivemind_plugin_manager", "tornado")]
        assert hub == [], hub
        assert all(getattr(encryption, n) is c for n, c in codecs.items())
    """)
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, timeout=60)


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError):
        getattr(hivemind_chat_agent, "NoSuchThing")  # noqa: B009 (the lookup is the test)
    assert "Subscription" in dir(hivemind_chat_agent)
