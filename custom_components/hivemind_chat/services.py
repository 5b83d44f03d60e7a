"""The `hivemind_chat.ask` action: an utterance to the hub from an automation or script, the
hub's answer as the action's response.

    action: hivemind_chat.ask
    data: {config_entry_id: ..., text: "what time is it", conversation_id: kitchen}
    response_variable: hub     # {speech, continue_conversation, conversation_id, understood}

Each conversation_id is one OVOS session, as in the conversation entity (without one, the
entry's "automation" conversation), so an automation can answer a skill's question with a
second call. A hub that did not answer raises HomeAssistantError with the spoken failure
(naming the hub); an utterance nothing understood is a response with `understood: false`.

What the hub says later to an action's session (the alarm an automation set) is a
`hivemind_chat_speech` event with the action's conversation_id, as for the entity's
conversations (the entry's one SpeechWatch, its bound). An action's session is lasting: HA
keeps no conversation for it to forget, so it is watched until the bound evicts it (a turn of
another session) or the entry is unloaded.
"""
from typing import Any

import probatio
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant, ServiceCall, SupportsResponse
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import entity_registry as er

from hivemind_chat_agent.bridges.ha_native import (
    CONF_LANGUAGE,
    DOMAIN,
    answer_for,
    hub_name,
    run_turn,
    session_for,
)
from hivemind_chat_agent.bridges.ha_speech import speech_context

AUTOMATION_CONVERSATION = "automation"
ASK_SCHEMA = probatio.Schema({
    probatio.Required("config_entry_id"): str,
    probatio.Required("text"): probatio.All(str, probatio.Length(min=1)),
    probatio.Optional("conversation_id"): str,
    probatio.Optional("language"): str,
})


async def async_ask(call: ServiceCall) -> dict[str, Any]:
    """One turn on the entry's hub; its answer (see the module's docstring)."""
    entry = call.hass.config_entries.async_get_entry(call.data["config_entry_id"])
    if entry is None or entry.domain != DOMAIN or entry.state is not ConfigEntryState.LOADED:
        raise ServiceValidationError(translation_domain=DOMAIN, translation_key="not_loaded")
    conversation_id = call.data.get("conversation_id") or AUTOMATION_CONVERSATION
    session_id, site_id = session_for(entry.entry_id, conversation_id, None, None, False)
    lang = call.data.get("language") or entry.options.get(CONF_LANGUAGE) or \
        call.hass.config.language
    report = await run_turn(entry.runtime_data.agent, call.data["text"],
                            session_id=session_id, lang=lang, site_id=site_id)
    if report.error is None:     # as the entity does: only after a turn that went well
        entity_id = er.async_get(call.hass).async_get_entity_id("conversation", DOMAIN,
                                                                 entry.entry_id)
        entry.runtime_data.watch_speech(call.hass, session_id, speech_context(
            entry.entry_id, entity_id, conversation_id, session_id, lang))
    answer = answer_for(report, hub_name(entry.data))
    if not report.sentences and report.error is not None:
        raise HomeAssistantError(answer.speech)
    return {"speech": answer.speech, "continue_conversation": answer.continue_conversation,
            "conversation_id": conversation_id, "understood": answer.error_code is None}


def async_setup_services(hass: HomeAssistant) -> None:
    hass.services.async_register(DOMAIN, "ask", async_ask, schema=ASK_SCHEMA,
                                 supports_response=SupportsResponse.ONLY)
