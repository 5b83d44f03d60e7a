"""The hub's speech between turns as HA events (hivemind_chat_agent/bridges/ha_speech.py),
without Home Assistant or a hub: which sessions are watched, what each event carries, the
bound, and the releases. tests/test_home_assistant_native.py fires them in a genuine HA from
a genuine hub."""
import pytest

from hivemind_chat_agent.bridges.ha_speech import SpeechWatch, speech_event
from hivemind_chat_agent.errors import AgentClosedError, HubUnreachableError


class FakeSubscription:
    def __init__(self, session_id, callback):
        self.session_id, self.callback, self.closed = session_id, callback, False

    def close(self):
        self.closed = True


class FakeAgent:
    """subscribe() as HiveMindChatAgent's: a Subscription whose callback gets each sentence."""

    def __init__(self, error=None):
        self.subs, self.error = [], error

    def subscribe(self, session_id, callback=None):
        if self.error is not None:
            raise self.error
        sub = FakeSubscription(session_id, callback)
        self.subs.append(sub)
        return sub

    def open_for(self, session_id):
        return [s for s in self.subs if s.session_id == session_id and not s.closed]


def context(n):
    return {"config_entry_id": "e1", "entity_id": "conversation.hub", "conversation_id": f"c{n}",
            "session_id": f"s{n}", "device_id": None, "satellite_id": None, "language": "en"}


def watching(watch, n):
    if not watch.remember(f"s{n}", context(n)):
        assert watch.watch(f"s{n}")


def test_a_sentence_between_turns_is_one_event_with_the_sessions_last_turn():
    agent, fired = FakeAgent(), []
    watch = SpeechWatch(agent, fired.append)
    watching(watch, 1)
    watch.remember("s1", {**context(1), "conversation_id": "c1-later", "language": "de-DE"})
    agent.open_for("s1")[0].callback("your alarm is going off")
    assert fired == [{**context(1), "conversation_id": "c1-later", "language": "de-DE",
                      "text": "your alarm is going off"}]
    assert speech_event(context(2), "hi")["text"] == "hi"


def test_one_subscription_per_session_however_many_turns():
    agent = FakeAgent()
    watch = SpeechWatch(agent, lambda data: None)
    for _ in range(3):
        watching(watch, 1)
    assert watch.watch("s1") is True          # a second watch subscribes nothing more
    assert len(agent.subs) == 1 and len(agent.open_for("s1")) == 1


def test_past_the_bound_the_session_used_longest_ago_is_released():
    agent = FakeAgent()
    watch = SpeechWatch(agent, lambda data: None, limit=2)
    watching(watch, 1)
    watching(watch, 2)
    watching(watch, 1)            # s1 used again: s2 is now the oldest
    watching(watch, 3)
    assert watch.watched() == ["s1", "s3"]
    assert agent.open_for("s2") == [] and agent.open_for("s1") and agent.open_for("s3")


def test_release_and_close_end_the_subscriptions_and_their_events():
    agent, fired = FakeAgent(), []
    watch = SpeechWatch(agent, fired.append)
    watching(watch, 1)
    watching(watch, 2)
    callback = agent.open_for("s1")[0].callback
    watch.release("s1")
    callback("too late")                      # a sentence already on its way
    assert agent.open_for("s1") == [] and fired == []
    watch.close()
    assert agent.open_for("s2") == [] and watch.watched() == []
    watch.remember("s3", context(3))
    assert watch.watch("s3") is False and agent.open_for("s3") == []


@pytest.mark.parametrize("error", [HubUnreachableError("down"), AgentClosedError("shut")])
def test_a_hub_that_cannot_be_subscribed_now_is_tried_at_the_next_turn(error):
    agent = FakeAgent(error=error)
    watch = SpeechWatch(agent, lambda data: None)
    assert watch.remember("s1", context(1)) is False
    assert watch.watch("s1") is False
    agent.error = None
    assert watch.remember("s1", context(1)) is False and watch.watch("s1") is True
    assert watch.watched() == ["s1"]


def test_the_bound_is_at_least_one():
    with pytest.raises(ValueError):
        SpeechWatch(FakeAgent(), lambda data: None, limit=0)


def test_two_watches_of_one_session_at_once_keep_one_subscription():
    """Two turns of a new session subscribe at once (off the loop, not waited for): the one
    that finishes second closes its own subscription."""
    agent = FakeAgent()
    watch = SpeechWatch(agent, lambda data: None)
    subscribe = agent.subscribe

    def twin_first(session_id, callback=None):
        agent.subscribe = subscribe
        assert watch.watch(session_id) is True      # the twin, finishing first
        return subscribe(session_id, callback)
    agent.subscribe = twin_first
    watch.remember("s1", context(1))
    assert watch.watch("s1") is True
    assert len(agent.subs) == 2 and len(agent.open_for("s1")) == 1
    assert watch.watched() == ["s1"]
