"""The hub plugin hands its engine each satellite session's conversation (history_turns), in
the real `hivemind-core listen` of both generations, with genuine satellites."""
import json

import pytest
from hubs import HubProcess, plugin_config

pytestmark = pytest.mark.hub


def history(agent, session_id):
    return json.loads(agent.get_response("history", session_id=session_id))


@pytest.fixture(scope="module")
def history_hub(generation):
    hub = HubProcess(plugin_config(timeout=5), generation=generation).start()
    yield hub
    hub.cleanup()


def test_the_third_turn_reaches_the_engine_with_the_two_before_it(history_hub, make_agent):
    agent = make_agent(history_hub.add_client().agent_config(timeout=10))
    assert agent.get_response("hello", session_id="kitchen") == "hello there"
    assert agent.get_response("count 2", session_id="kitchen") == "sentence 1\nsentence 2"
    assert history(agent, "kitchen") == [["user", "hello"], ["assistant", "hello there"],
                                         ["user", "count 2"],
                                         ["assistant", "sentence 1\nsentence 2"]]


def test_other_sessions_and_other_satellites_see_none_of_it(history_hub, make_agent):
    a = make_agent(history_hub.add_client().agent_config(timeout=10))
    b = make_agent(history_hub.add_client().agent_config(timeout=10))
    assert a.get_response("hello", session_id="hall") == "hello there"
    assert history(a, "porch") == []                 # another session of the same satellite
    assert history(b, "hall") == []                  # the same declared id, another satellite


def test_a_failed_turn_is_never_passed_off_as_an_answer(history_hub, make_agent):
    from hivemind_chat_agent import HubEngineError
    agent = make_agent(history_hub.add_client().agent_config(timeout=10))
    assert agent.get_response("hello", session_id="s") == "hello there"
    with pytest.raises(HubEngineError):
        agent.get_response("raise", session_id="s")
    assert history(agent, "s") == [["user", "hello"], ["assistant", "hello there"]]


def test_history_turns_zero_sends_the_engine_one_message(generation, make_agent):
    hub = HubProcess(plugin_config(history_turns=0), generation=generation).start()
    try:
        agent = make_agent(hub.add_client().agent_config(timeout=10))
        assert agent.get_response("hello", session_id="s") == "hello there"
        assert history(agent, "s") == []
    finally:
        hub.cleanup()


def test_a_redis_store_keeps_the_conversation_through_a_hub_restart(generation, make_agent,
                                                                    tmp_path):
    """The plugin on a real redis-server in the real `hivemind-core listen` of each
    generation (5.x's replicas tests run only 5.x): the history is Redis's, so a restarted hub
    process goes on with it; and the turns began early (hub/redis_connections.py: the IO loop wrote
    each begin, a worker read it), which on 4.0 is tornado's loop: after turns one at a time,
    no connection of the hub sits unused since it connected, as the one kept for the next
    early begin would if the IO loop never wrote to it."""
    import redis
    from servers import RedisServer
    server = RedisServer(str(tmp_path / "redis")).start()
    hub = HubProcess(plugin_config(timeout=5, conversation_store=server.url),
                     generation=generation)
    ours = redis.Redis(port=server.port, decode_responses=True)
    try:
        hub.start()
        config = hub.add_client().agent_config(timeout=10)
        agent = make_agent(config)
        assert agent.get_response("hello", session_id="den") == "hello there"
        for n in (1, 2, 3):
            assert agent.get_response(f"count {n}", session_id="den") == \
                "\n".join(f"sentence {k}" for k in range(1, n + 1))
        own = ours.client_id()
        hubs = [c for c in ours.client_list() if int(c["id"]) != own]
        assert len(hubs) >= 2 and not [c for c in hubs if c["cmd"] == "NULL"], hubs
        agent.shutdown()
        hub.stop()
        hub.start()
        again = make_agent(config)
        assert [role for role, _ in history(again, "den")] == ["user", "assistant"] * 4
    finally:
        ours.close()
        hub.cleanup()
        server.stop()
