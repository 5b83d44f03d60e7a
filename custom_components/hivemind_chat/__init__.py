"""HiveMind Chat: an OVOS hub, reached over HiveMind, as a Home Assistant conversation agent.

One config entry is one hub (host, port, access key, password). Setting it up creates the
entry's `HiveMindChatAgent` and its `SpeechWatch` (entry.runtime_data, `HiveMindChatRuntime`)
and connects the agent: a hub that refuses the key or password fails the setup with
ConfigEntryAuthFailed (HA's reauth flow asks for new ones); one that is down at that moment
is logged, and the agent connects at the next turn, whose answer until then says the hub is
out of reach. The entry's one SpeechWatch hears the hub's speech between turns for the
conversation entity and the `hivemind_chat.ask` action alike (one bound, one subscription per
session whichever used it). Unloading closes every subscription, then shuts the agent down:
every connection and thread of it ends. The `hivemind_chat.ask` action is services.py's. The
logic worth testing without Home Assistant is in hivemind_chat_agent.bridges.ha_native; this
is the glue.
"""
import logging
from dataclasses import dataclass
from typing import Any, Mapping

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant, callback
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.typing import ConfigType

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.bridges.ha_native import DOMAIN, agent_config, hub_name, needs_reauth
from hivemind_chat_agent.bridges.ha_speech import EVENT_SPEECH, SpeechWatch
from hivemind_chat_agent.errors import HiveMindChatError

LOG = logging.getLogger(__name__)
PLATFORMS = [Platform.CONVERSATION]
CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)

HiveMindChatConfigEntry = ConfigEntry  # entry.runtime_data: its HiveMindChatRuntime


@dataclass
class HiveMindChatRuntime:
    """What a loaded entry holds: its agent, and the one SpeechWatch both the conversation
    entity and the ask action hand their sessions to (so the bound is the entry's, and
    unloading has one place to close every subscription)."""

    agent: HiveMindChatAgent
    speech: SpeechWatch

    @callback
    def watch_speech(self, hass: HomeAssistant, session_id: str,
                     context: Mapping[str, Any]) -> None:
        """Hear `session_id`'s speech between turns with `context` as its events' data
        (ha_speech.speech_event). Called on the loop after a turn that went well: noting the
        context never blocks, the subscribing (a new session) runs off the loop, not waited
        for; a hub that cannot be reached now is tried again at the session's next turn."""
        if not self.speech.remember(session_id, context):
            hass.async_add_executor_job(self.speech.watch, session_id)

    def close(self) -> None:
        """(Blocking: off the loop.) Every subscription closed, then the agent shut down."""
        self.speech.close()
        self.agent.shutdown()


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
    # bus.fire is thread-safe: the watch fires on its subscriptions' threads
    entry.runtime_data = HiveMindChatRuntime(agent, SpeechWatch(
        agent, lambda data: hass.bus.fire(EVENT_SPEECH, data)))
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    return True


async def async_unload_entry(hass: HomeAssistant, entry: HiveMindChatConfigEntry) -> bool:
    """Unload the conversation entity, then close every speech subscription (no event after
    this) and shut the agent down (off the event loop)."""
    unloaded = await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
    if unloaded:
        await hass.async_add_executor_job(entry.runtime_data.close)
    return unloaded
