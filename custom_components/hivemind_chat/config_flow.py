"""The config flow: a hub's host, port, access key and password, validated by connecting.

A refused key or password shows `invalid_auth`, nothing answering `cannot_connect`, a hub
whose Noise key (or TLS certificate) is not the one pinned for that address
`hub_key_changed`; strings.json says each in words. A hub that refuses the key later starts
the reauth step (new key and password for the same hub). The options (language, one conversation
per device, timeout) reload the entry when changed.
"""
import logging
from collections.abc import Mapping
from typing import Any

import probatio
from homeassistant.config_entries import (
    ConfigEntry,
    ConfigFlow,
    ConfigFlowResult,
    OptionsFlow,
    OptionsFlowWithReload,
)
from homeassistant.core import HomeAssistant, callback

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.bridges.ha_native import (
    CONF_HOME_CONTROL,
    CONF_HOST,
    CONF_KEY,
    CONF_LANGUAGE,
    CONF_PASSWORD,
    CONF_PER_DEVICE,
    CONF_PORT,
    CONF_TIMEOUT,
    DEFAULT_PORT,
    DEFAULT_TIMEOUT,
    DOMAIN,
    agent_config,
    flow_error,
    hub_name,
)
from hivemind_chat_agent.errors import HiveMindChatError

from . import storage_dir

LOG = logging.getLogger(__name__)

USER_SCHEMA = probatio.Schema({
    probatio.Required(CONF_HOST): str,
    probatio.Required(CONF_PORT, default=DEFAULT_PORT): probatio.All(
        probatio.Coerce(int), probatio.Range(min=1, max=65535)),
    probatio.Required(CONF_KEY): str,
    probatio.Required(CONF_PASSWORD): str,
})

REAUTH_SCHEMA = probatio.Schema({
    probatio.Required(CONF_KEY): str,
    probatio.Required(CONF_PASSWORD): str,
})


async def connect_error(hass: HomeAssistant, data: dict[str, Any]) -> str | None:
    """Connect to the hub once with these credentials: None when it took them, else the
    form error (ha_native.flow_error). The agent is shut down either way."""
    config = agent_config(data, {}, storage_dir(hass, data))
    try:
        agent = await hass.async_add_executor_job(HiveMindChatAgent, config)
    except HiveMindChatError as e:
        return flow_error(e)
    try:
        await agent.awarm_up()
    except (HiveMindChatError, OSError) as e:
        LOG.info("connecting to the OVOS hub at %s: %s", hub_name(data), type(e).__name__)
        return flow_error(e)
    finally:
        await hass.async_add_executor_job(agent.shutdown)
    return None


class HiveMindChatConfigFlow(ConfigFlow, domain=DOMAIN):
    """Add an OVOS hub: one entry per hub address."""

    VERSION = 1

    async def async_step_user(self, user_input: dict[str, Any] | None = None
                              ) -> ConfigFlowResult:
        """The one form; shown again with the error until the hub takes the credentials."""
        errors: dict[str, str] = {}
        if user_input is not None:
            # a form shown again with its error is a flow in progress for this hub: the id is
            # claimed once the hub took the credentials, so a second try is not refused
            self._async_abort_entries_match({CONF_HOST: user_input[CONF_HOST],
                                             CONF_PORT: user_input[CONF_PORT]})
            error = await connect_error(self.hass, user_input)
            if error is None:
                await self.async_set_unique_id(hub_name(user_input), raise_on_progress=False)
                self._abort_if_unique_id_configured()
                return self.async_create_entry(title=f"OVOS hub at {hub_name(user_input)}",
                                               data=user_input)
            errors["base"] = error
        schema = self.add_suggested_values_to_schema(
            USER_SCHEMA, {k: v for k, v in (user_input or {}).items() if k != CONF_PASSWORD})
        return self.async_show_form(step_id="user", data_schema=schema, errors=errors)

    async def async_step_reauth(self, entry_data: Mapping[str, Any]) -> ConfigFlowResult:
        """The hub refused the entry's access key or password (at setup, or at a turn)."""
        return await self.async_step_reauth_confirm()

    async def async_step_reauth_confirm(self, user_input: dict[str, Any] | None = None
                                        ) -> ConfigFlowResult:
        """New access key and password for the same hub, validated by connecting; the entry
        is updated and reloaded (its old agent shut down)."""
        entry = self._get_reauth_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            error = await connect_error(self.hass, {**entry.data, **user_input})
            if error is None:
                return self.async_update_reload_and_abort(entry, data_updates=user_input)
            errors["base"] = error
        return self.async_show_form(step_id="reauth_confirm", data_schema=REAUTH_SCHEMA,
                                    errors=errors,
                                    description_placeholders={"hub": hub_name(entry.data)})

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: ConfigEntry) -> OptionsFlow:
        return HiveMindChatOptionsFlow()


class HiveMindChatOptionsFlow(OptionsFlowWithReload):
    """Language (empty: Home Assistant's), one conversation per device, the CONTROL feature,
    the turn timeout."""

    async def async_step_init(self, user_input: dict[str, Any] | None = None
                              ) -> ConfigFlowResult:
        if user_input is not None:
            return self.async_create_entry(data=user_input)
        options = self.config_entry.options
        schema = probatio.Schema({
            probatio.Optional(CONF_LANGUAGE,
                              description={"suggested_value": options.get(CONF_LANGUAGE)}): str,
            probatio.Required(CONF_PER_DEVICE,
                              default=bool(options.get(CONF_PER_DEVICE, False))): bool,
            probatio.Required(CONF_HOME_CONTROL,
                              default=bool(options.get(CONF_HOME_CONTROL, True))): bool,
            probatio.Required(CONF_TIMEOUT,
                              default=float(options.get(CONF_TIMEOUT, DEFAULT_TIMEOUT))):
                probatio.All(probatio.Coerce(float), probatio.Range(min=1, max=600)),
        })
        return self.async_show_form(step_id="init", data_schema=schema)
