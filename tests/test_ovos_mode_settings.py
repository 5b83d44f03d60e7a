"""The OVOS mode's server.json keys: the mode picks the protocol, and a bad mode or bus URL is
a ConfigurationError that says what to write (no hub, no bus: quick loop)."""
import json
import os

import pytest

from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.hub.ovos_settings import DEFAULT_BUS, OvosModeSettings, mode_of
from hivemind_chat_agent.hub.plugin import agent_protocol

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")


def test_the_mode_defaults_to_chat_and_an_unknown_one_says_what_to_write():
    assert mode_of({}) == "chat" and mode_of({"mode": "ovos"}) == "ovos"
    with pytest.raises(ConfigurationError) as e:
        mode_of({"mode": "ovos-core"})
    assert '"mode": "ovos", "bus": "ws://127.0.0.1:8181/core"' in str(e.value)


@pytest.mark.parametrize("bus", ["http://127.0.0.1:8181/core", "ws://", "ws://h:99999/core",
                                 8181, ""])
def test_a_bad_bus_url_says_what_to_write(bus):
    with pytest.raises(ConfigurationError) as e:
        OvosModeSettings.from_dict({"mode": "ovos", "bus": bus})
    assert '"bus": "ws://127.0.0.1:8181/core"' in str(e.value)


def test_bounds_are_checked():
    with pytest.raises(ConfigurationError):
        OvosModeSettings.from_dict({"max_in_flight_per_session": 0})
    with pytest.raises(ConfigurationError):
        OvosModeSettings.from_dict({"in_flight_timeout": "soon"})
    assert OvosModeSettings.from_dict({}).bus == DEFAULT_BUS


def test_probation_defaults_turns_off_and_says_what_to_write():
    assert OvosModeSettings.from_dict({}).probation == (2.0, 0.25)
    assert OvosModeSettings.from_dict({"probation_seconds": 0,
                                       "probation_share": 0.5}).probation == (0.0, 0.5)
    for bad in ({"probation_seconds": -1}, {"probation_share": 0}, {"probation_share": 2}):
        with pytest.raises(ConfigurationError, match="probation"):
            OvosModeSettings.from_dict(bad)


def test_the_example_server_config_is_an_ovos_mode_config():
    with open(os.path.join(CONFIG, "server-ovos.json")) as f:
        section = json.load(f)["agent_protocol"]
    assert section["module"] == "hivemind-chat-agent-plugin"
    settings = OvosModeSettings.from_dict(section["hivemind-chat-agent-plugin"])
    assert settings.bus == "ws://127.0.0.1:8181/core"
    assert settings.limits.max_in_flight_per_session == 4


def test_the_entry_point_gives_the_ovos_mode_and_refuses_an_unknown_one():
    from hivemind_chat_agent.hub.ovos_mode import OVOSModeProtocol
    protocol = agent_protocol(config={"mode": "ovos", "bus": "ws://127.0.0.1:9/core",
                                      "connect_wait": 0})
    try:
        assert isinstance(protocol, OVOSModeProtocol)
        assert protocol.get_bus() is protocol.bus
    finally:
        protocol.shutdown()
    with pytest.raises(ConfigurationError, match="nope"):
        agent_protocol(config={"mode": "nope"})
