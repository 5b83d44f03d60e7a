"""HiveMind Chat: an OVOS hub, reached over HiveMind, as a Home Assistant conversation agent.

One config entry is one hub (host, port, access key, password). Setting it up creates the
entry's `HiveMindChatAgent` (entry.runtime_data) and connects it: a hub that refuses the key
or password fails the setup with ConfigEntryAuthFailed (HA's reauth flow asks for new ones);
one that is down at that moment is logged, and the agent connects at the next turn, whose
answer until then says the hub is out of reach. Unloading shuts the agent down: every
connection and thread of it ends. The `hivemind_chat.ask` action is services.py's. The logic
worth testing without Home Assistant is in hivemind_chat_agent.bridges.ha_native; this is
the glue.
"""
import logging

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.typing import ConfigType

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.bridges.ha_native import DOMAIN, agent_config, hub_name, needs_reauth
from hivemind_chat_agent.errors import HiveMindChatError

LOG = logging.getLogger(__name__)
PLATFORMS = [Platform.CONVERSATION]
CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)

HiveMindChatConfigEntry = ConfigEntry  # entry.runtime_data: its HiveMindChatAgent


def storage_dir(hass: HomeAssistant, data) -> str:
    """Where the hub's Noise pin and the sessions are kept (under HA's .storage): one folder
    per hub address, shared by the config flow and the entry, so a changed hub key shows."""
    return hass.config.path(".storage", DOMAIN, hub_name(data).replace(":", "_"))


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """The `hivemind_chat.ask` action (services.py), once for every entry."""
    from .services import async_setup_services
    async_setup_services(hass)
    return True


async def async_setup_entry(hass: HomeAssistant, entry: HiveMindChatConfigEntry) -> bool:
    """Create the entry's agent and connect it (a failure to connect is logged, not fatal)."""
    config = agent_config(entry.data, entry.options, storage_dir(hass, entry.data))
    agent = await hass.async_add_executor_job(HiveMindChatAgent, config)
    try:
        await agent.awarm_up()
    except HiveMindChatError as e:
        if needs_reauth(e):    # HA asks for new credentials (config_flow's reauth step)
            await hass.async_add_executor_job(agent.shutdown)
            raise ConfigEntryAuthFailed(f"the OVOS hub at {hub_name(entry.data)} refused the "
                                        "access key or the password") from e
        LOG.warning("the OVOS hub at %s is not ready (%s); turns say so until it is",
                    hub_name(entry.data), type(e).__name__)
    entry.runtime_data = agent
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_unload_entry(hass: HomeAssistant, entry: HiveMindChatConfigEntry) -> bool:
    """Unload the conversation entity, then shut the agent down (off the event loop)."""
    unloaded = await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
    if unloaded:
        await hass.async_add_executor_job(entry.runtime_data.shutdown)
    return unloaded
