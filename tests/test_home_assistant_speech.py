"""The native integration in a genuine Home Assistant 2026.11 (tests/ha_process.py), beyond a
turn's answer, against genuine hivemind-core hubs of both generations:

- the hub's speech between turns (tests/pipeline_agent.py's "later SECONDS": an answer, then
  one more sentence SECONDS after its turn ended, as an alarm going off) is a
  `hivemind_chat_speech` event on HA's bus, seen through HA's websocket API as an
  automation's event trigger sees it; none once the entry is unloaded.

Skipped, saying why, only where the HA runtime cannot be built (test_home_assistant_native)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_home_assistant_native as native  # noqa: E402
from ha_process import speech  # noqa: E402
from waiting import hold_still, wait_until  # noqa: E402

# the genuine HA of test_home_assistant_native's fixtures (one `hass` for this module)
ha_root, home_assistant, add_entry = native.ha_root, native.home_assistant, native.add_entry

EVENT = "hivemind_chat_speech"


def spoken(listener, text):
    return [e for e in listener.events if e["data"].get("text") == text]


def test_the_hubs_speech_between_turns_is_an_event_automations_can_trigger_on(
        home_assistant, hub):
    ha = home_assistant
    entry_id, entity = add_entry(ha, hub.port, hub.add_client())
    listener = ha.listen(EVENT)
    try:
        answer = ha.say(entity, "later 1", "later-1", language="en-GB")
        assert speech(answer) == "now you wait"      # the turn is over: "handled"
        events = wait_until(lambda: spoken(listener, "the wait is over"), 10)
        assert len(events) == 1, listener.events
        data = events[0]["data"]
        assert {k: data[k] for k in ("config_entry_id", "entity_id", "conversation_id",
                                     "language", "device_id")} == {
            "config_entry_id": entry_id, "entity_id": entity, "conversation_id": "later-1",
            "language": "en-GB", "device_id": None}
        assert data["session_id"].startswith("ha-") and events[0]["event_type"] == EVENT
        # a turn's own answer is no event; nor does a second turn subscribe twice
        assert speech(ha.say(entity, "later 0.5", "later-1")) == "now you wait"
        assert wait_until(lambda: len(spoken(listener, "the wait is over")) == 2, 10)
        hold_still()
        assert [e["data"]["text"] for e in listener.events] == ["the wait is over"] * 2
        # unloaded (the entry removed) while the hub still has something to say: no event
        assert speech(ha.say(entity, "later 2", "later-2")) == "now you wait"
        status, _ = ha.request("DELETE", f"/api/config/config_entries/entry/{entry_id}")
        assert status == 200
        time.sleep(2)            # the hub's "later 2": its sentence is due now
        hold_still()
        assert len(listener.events) == 2, listener.events
    finally:
        listener.close()
        ha.request("DELETE", f"/api/config/config_entries/entry/{entry_id}")
