"""The conversation entity: each Home Assistant turn is one turn of the entry's agent.

Each HA conversation_id is one OVOS session (or, with the per-device option, each satellite
or device one), namespaced by the entry; the language is HA's (or the option's). The hub's
sentences go into the chat log as deltas while it speaks them (`supports_streaming`), so HA's
streaming TTS starts at the first sentence. `continue_conversation` is true exactly when the
hub asked a question (TurnStatus.ASKED), so a satellite reopens its microphone. A turn the
hub did not answer is an intent error response whose speech names the hub; the agent's own
message goes to HA's log only. A turn HA gives up on (cancelled) is stopped at the hub. The
entity has the CONTROL feature unless the home_control option is off. A hub that refuses the
entry's key or password starts HA's reauth flow (config_flow.py).

What the hub says to a session the entity used when no turn of it runs (an alarm, a
reminder) is fired on HA's bus as a `hivemind_chat_speech` event, a sentence each, by the
entry's SpeechWatch (entry.runtime_data.speech, shared with the ask action;
bridges/ha_speech.py: which sessions, how many, when they are released). A conversation's
session is released when HA forgets the conversation; a device's lasts; unloading the entry
closes them all (__init__.py).
"""
import logging
from functools import partial
from typing import Literal

from homeassistant.components import conversation
from homeassistant.const import MATCH_ALL
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import chat_session, intent
from homeassistant.helpers.device_registry import DeviceEntryType, DeviceInfo
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from hivemind_chat_agent.bridges.ha_native import (
    CONF_HOME_CONTROL,
    CONF_LANGUAGE,
    CONF_PER_DEVICE,
    DOMAIN,
    TurnReport,
    answer_for,
    hub_name,
    needs_reauth,
    run_turn,
    session_for,
)
from hivemind_chat_agent.bridges.ha_speech import speech_context

from . import HiveMindChatConfigEntry

LOG = logging.getLogger(__name__)


async def async_setup_entry(hass: HomeAssistant, entry: HiveMindChatConfigEntry,
                            async_add_entities: AddConfigEntryEntitiesCallback) -> None:
    async_add_entities([HiveMindConversationEntity(entry)])


class HiveMindConversationEntity(conversation.ConversationEntity,
                                 conversation.AbstractConversationAgent):
    """The OVOS hub of one config entry as a conversation agent."""

    _attr_has_entity_name = True
    _attr_name = None
    _attr_supports_streaming = True

    def __init__(self, entry: HiveMindChatConfigEntry) -> None:
        self.entry = entry
        self.hub = hub_name(entry.data)
        self._attr_unique_id = entry.entry_id
        # an OVOS hub's skills usually control things themselves (without CONTROL, HA tells
        # users "this assistant cannot control your home"); an option turns it off
        if entry.options.get(CONF_HOME_CONTROL, True):
            self._attr_supported_features = conversation.ConversationEntityFeature.CONTROL
        self._attr_device_info = DeviceInfo(
            identifiers={(DOMAIN, entry.entry_id)}, name=entry.title,
            manufacturer="OpenVoiceOS", model="HiveMind hub",
            entry_type=DeviceEntryType.SERVICE)
        self._forgettable: set[str] = set()   # conversations whose forgetting releases a watch

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        return MATCH_ALL    # the hub's skills decide what they understand

    async def async_added_to_hass(self) -> None:
        await super().async_added_to_hass()
        conversation.async_set_agent(self.hass, self.entry, self)

    async def async_will_remove_from_hass(self) -> None:
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()

    async def _async_handle_message(self, user_input: conversation.ConversationInput,
                                    chat_log: conversation.ChatLog
                                    ) -> conversation.ConversationResult:
        """One turn: the hub's sentences streamed into `chat_log`, then the result."""
        report = await self._run_turn(user_input, chat_log)
        if report.error is not None:
            LOG.warning("a turn on the OVOS hub at %s failed: %s: %s", self.hub,
                        type(report.error).__name__, report.error)
        if needs_reauth(report.error):     # the hub refuses the key now: ask for new ones
            self.entry.async_start_reauth(self.hass)
        answer = answer_for(report, self.hub)
        response = intent.IntentResponse(language=user_input.language)
        if answer.error_code is not None:
            response.async_set_error(intent.IntentResponseErrorCode(answer.error_code),
                                     answer.speech)
        else:
            response.async_set_speech(answer.speech)
        if not report.sentences:    # the chat log gets what was said instead
            chat_log.async_add_assistant_content_without_tools(
                conversation.AssistantContent(agent_id=self.entity_id, content=answer.speech))
        return conversation.ConversationResult(
            response=response, conversation_id=chat_log.conversation_id,
            continue_conversation=answer.continue_conversation)

    async def _run_turn(self, user_input: conversation.ConversationInput,
                        chat_log: conversation.ChatLog) -> TurnReport:
        options = self.entry.options
        per_device = bool(options.get(CONF_PER_DEVICE))
        session_id, site_id = session_for(
            self.entry.entry_id, chat_log.conversation_id, user_input.device_id,
            user_input.satellite_id, per_device)
        lang = options.get(CONF_LANGUAGE) or user_input.language

        async def into_chat_log(deltas) -> None:
            async for _content in chat_log.async_add_delta_content_stream(self.entity_id,
                                                                          deltas):
                pass
        report = await run_turn(self.entry.runtime_data.agent, user_input.text,
                                session_id=session_id, lang=lang, site_id=site_id,
                                consume=into_chat_log)
        if report.error is None:     # the session's connection is up: subscribing is quick
            self._watch_speech(session_id, user_input, chat_log.conversation_id, lang,
                               lasting=per_device and site_id != "home-assistant")
        return report

    @callback
    def _watch_speech(self, session_id: str, user_input: conversation.ConversationInput,
                      conversation_id: str, lang: str, lasting: bool) -> None:
        """Watch the session's speech between turns (subscribing off the loop, not waited
        for); unless it is a device's (`lasting`), until HA forgets the conversation. Called
        after a turn that went well: beside a turn, the subscription would wait for its
        session, and a hub that is down would be tried twice per turn."""
        context = speech_context(self.entry.entry_id, self.entity_id, conversation_id,
                                 session_id, lang, device_id=user_input.device_id,
                                 satellite_id=user_input.satellite_id)
        self.entry.runtime_data.watch_speech(self.hass, session_id, context)
        session = chat_session.current_session.get()
        if not lasting and session is not None and conversation_id not in self._forgettable:
            self._forgettable.add(conversation_id)
            session.async_on_cleanup(partial(self._forgotten, conversation_id, session_id))

    @callback
    def _forgotten(self, conversation_id: str, session_id: str) -> None:
        """HA forgot the conversation (chat_session's cleanup): release its session's watch."""
        self._forgettable.discard(conversation_id)
        self.hass.async_add_executor_job(self.entry.runtime_data.speech.release, session_id)
