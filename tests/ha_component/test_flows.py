"""The config flow's errors, reauth and options through HA's flow manager: the quick layer
(test_home_assistant_native.py drives each end to end through a running hass's REST API).
Against the genuine hub the host started (conftest.py); a port nothing listens on is taken
from a socket bound and closed here.
"""
import socket

from homeassistant import config_entries
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType

from hivemind_chat_agent.bridges.ha_native import DOMAIN


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def user_step(hass: HomeAssistant, data):
    flow = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER})
    assert flow["type"] is FlowResultType.FORM and flow["errors"] == {}
    return await hass.config_entries.flow.async_configure(flow["flow_id"], data)


async def test_each_error_of_the_form_then_an_entry(hass: HomeAssistant, hub_data):
    result = await user_step(hass, {**hub_data, "password": "not-it"})
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "invalid_auth"}
    result = await user_step(hass, {**hub_data, "port": closed_port()})
    assert result["errors"] == {"base": "cannot_connect"}
    # the form shown again with its error is retried in the same flow
    result = await hass.config_entries.flow.async_configure(result["flow_id"], hub_data)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    entry = result["result"]
    assert entry.unique_id == f"127.0.0.1:{hub_data['port']}"
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    assert (await user_step(hass, hub_data))["reason"] == "already_configured"
    assert await hass.config_entries.async_unload(entry.entry_id)


async def test_reauth_takes_new_credentials_only_when_the_hub_does(hass: HomeAssistant,
                                                                   loaded_entry, hub_data):
    result = await loaded_entry.start_reauth_flow(hass)
    assert result["step_id"] == "reauth_confirm"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"access_key": hub_data["access_key"], "password": "not-it"})
    assert result["errors"] == {"base": "invalid_auth"}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"access_key": hub_data["access_key"],
                            "password": hub_data["password"]})
    assert result["type"] is FlowResultType.ABORT and result["reason"] == "reauth_successful"
    await hass.async_block_till_done()
    assert loaded_entry.state is ConfigEntryState.LOADED


async def test_changed_options_reload_the_entry_with_a_new_agent(hass: HomeAssistant,
                                                                  loaded_entry):
    old_agent = loaded_entry.runtime_data.agent
    result = await hass.config_entries.options.async_init(loaded_entry.entry_id)
    assert result["step_id"] == "init"
    result = await hass.config_entries.options.async_configure(
        result["flow_id"], {"language": "en-GB", "per_device": True, "home_control": False,
                            "timeout": 20.0})
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    assert loaded_entry.options["per_device"] is True
    assert loaded_entry.state is ConfigEntryState.LOADED
    assert old_agent.closed and loaded_entry.runtime_data.agent is not old_agent
