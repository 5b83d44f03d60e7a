"""How long the hub's speech between turns is heard, under HA's own clock: a conversation's
session is released when HA forgets the conversation (chat_session's 5-minute timeout, reached
here by a time jump with async_fire_time_changed, not by waiting), the ask action's sessions
outlive it, and unloading the entry closes every subscription and shuts the agent down.

Against the genuine hub the host started (conftest.py): its test pipeline answers "hello".
SpeechWatch.release is wrapped, calling through, so the test sees that it ran and for which
session; the subscriptions are the agent's own (Subscription.closed).
"""
import asyncio
from datetime import timedelta

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers.chat_session import CONVERSATION_TIMEOUT
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import async_fire_time_changed

from ha_component.conftest import entity_of, until


async def converse(hass: HomeAssistant, entity_id: str, text: str, conversation_id: str):
    result = await conversation.async_converse(hass, text, conversation_id, Context(),
                                               agent_id=entity_id)
    await hass.async_block_till_done()
    return result


async def ask(hass: HomeAssistant, entry, text: str, conversation_id: str):
    response = await hass.services.async_call(
        "hivemind_chat", "ask", {"config_entry_id": entry.entry_id, "text": text,
                                 "conversation_id": conversation_id},
        blocking=True, return_response=True)
    await hass.async_block_till_done()
    return response


def recording_release(speech):
    """Wrap `speech.release` (calling through): the list of session ids it was called with."""
    released, real = [], speech.release

    def release(session_id: str) -> None:
        released.append(session_id)
        real(session_id)
    speech.release = release
    return released


def jump_past_the_conversation_timeout(hass: HomeAssistant) -> None:
    async_fire_time_changed(hass, dt_util.utcnow() + CONVERSATION_TIMEOUT
                            + timedelta(seconds=5))


async def test_a_forgotten_conversation_releases_its_sessions_subscription(
        hass: HomeAssistant, loaded_entry):
    runtime, entity_id = loaded_entry.runtime_data, entity_of(hass, loaded_entry)
    result = await converse(hass, entity_id, "hello", "forget-me")
    assert result.response.speech["plain"]["speech"] == "hello there"
    [session_id] = await until(runtime.speech.watched)
    released = recording_release(runtime.speech)
    jump_past_the_conversation_timeout(hass)
    await hass.async_block_till_done()
    assert await until(lambda: released) == [session_id]    # (released off the loop)
    assert await until(lambda: runtime.speech.watched() == [])
    # a new turn of the same conversation_id is a new HA conversation: heard again
    await converse(hass, entity_id, "hello", "forget-me")
    assert await until(runtime.speech.watched) == [session_id]


async def test_the_ask_actions_sessions_outlive_the_conversation_timeout(
        hass: HomeAssistant, loaded_entry):
    runtime = loaded_entry.runtime_data
    response = await ask(hass, loaded_entry, "hello", "morning")
    assert response["speech"] == "hello there"
    [session_id] = await until(runtime.speech.watched)
    released = recording_release(runtime.speech)
    jump_past_the_conversation_timeout(hass)
    await hass.async_block_till_done()
    await asyncio.sleep(0.5)    # what a release would take off the loop (the entity's: at once)
    assert released == [] and runtime.speech.watched() == [session_id]


async def test_unloading_closes_every_subscription_and_shuts_the_agent_down(
        hass: HomeAssistant, loaded_entry):
    runtime, entity_id = loaded_entry.runtime_data, entity_of(hass, loaded_entry)
    subscriptions = []
    real_subscribe = runtime.agent.subscribe

    def subscribe(*args, **kwargs):
        subscriptions.append(real_subscribe(*args, **kwargs))
        return subscriptions[-1]
    runtime.agent.subscribe = subscribe
    await converse(hass, entity_id, "hello", "kitchen")
    await ask(hass, loaded_entry, "hello", "morning")
    await until(lambda: len(runtime.speech.watched()) == 2)
    assert len(subscriptions) == 2 and not any(s.closed for s in subscriptions)
    assert await hass.config_entries.async_unload(loaded_entry.entry_id)
    await hass.async_block_till_done()
    assert loaded_entry.state is ConfigEntryState.NOT_LOADED
    assert all(s.closed for s in subscriptions) and runtime.speech.watched() == []
    assert runtime.agent.closed
