"""`hivemind-chat openai` driven by the official `openai` client, against genuine hubs of both
generations (the OVOS-like test pipeline: tests/pipeline_agent.py)."""
import asyncio
import signal

import openai
import pytest
from fronts import Server, exited_cleanly, front_command, hub_options, reap, running, say
from hubs import free_port, wait_listening

from hivemind_chat_agent.bridges.serving import check_exposure
from hivemind_chat_agent.core.front_guard import Keys
from hivemind_chat_agent.errors import ConfigurationError


@pytest.fixture
def served(creds, make_agent):
    """`hivemind-chat openai` in-process on the session's hub."""
    with running(make_agent(creds.agent_config(timeout=5))) as server:
        yield server


def test_models_and_a_plain_answer(served):
    client = served.client()
    assert [m.id for m in client.models.list()] == ["hivemind-chat"]
    reply = client.chat.completions.create(model="gpt-4o", messages=[
        {"role": "system", "content": "you are helpful"}, {"role": "user", "content": "hello"}],
        temperature=0.2, max_tokens=50, metadata={"a": "b"},
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert reply.object == "chat.completion" and reply.model == "gpt-4o"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "hello there"
    assert reply.choices[0].finish_reason == "stop"


def test_a_streamed_answer_sends_each_sentence_and_ends_with_done(served):
    client = served.client()
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count 3"}], stream=True,
        stream_options={"include_usage": False}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "sentence 1\nsentence 2\nsentence 3" == say(client, "count 3")
    assert len([c for c in chunks if c.choices[0].delta.content]) == 3   # one per sentence


@pytest.mark.parametrize("naming", ["x-openwebui-chat-id", "x-conversation-id", "user",
                                    "history"])
def test_two_conversations_are_kept_apart_each_way_of_naming_one(served, naming):
    client = served.client()

    def turn(name, *messages):
        kw = {}
        if naming == "user":
            kw["user"] = name
        elif naming != "history":
            kw["extra_headers"] = {naming: name}
        return say(client, *(messages if naming == "history" else messages[-1:]), **kw)
    told_a = turn("A", "remember ada")
    told_b = turn("B", "remember bob")
    assert turn("A", "remember ada", told_a, "recall") == "you said ada"
    assert turn("B", "remember bob", told_b, "recall") == "you said bob"


def test_chats_that_began_alike_by_history_never_share_a_session(served):
    client = served.client()
    assert say(client, "hello") == say(client, "hello") == "hello there"
    told_a = say(client, "hello", "hello there", "remember ada")
    told_b = say(client, "hello", "hello there", "remember bob")
    assert say(client, "hello", "hello there", "remember ada", told_a, "recall") == \
        "you said ada"
    assert say(client, "hello", "hello there", "remember bob", told_b, "recall") == \
        "you said bob"


def test_a_follow_up_question_is_answered_by_the_next_message(served):
    client = served.client()
    question = say(client, "ask", user="follow-up")
    assert question == "what is your favourite colour?"
    assert say(client, "ask", question, "blue", user="follow-up") == "blue is a fine colour"


def test_a_wrong_or_missing_key_is_401_with_an_error_object(creds, make_agent):
    server = Server(make_agent(creds.agent_config(timeout=5)), api_keys=["s3cret"])
    try:
        with pytest.raises(openai.AuthenticationError) as refused:
            say(server.client(api_key="wrong"), "hello")
        assert refused.value.status_code == 401
        assert "Bearer" in refused.value.message
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").models.list()
        assert say(server.client(api_key="s3cret"), "hello") == "hello there"
    finally:
        server.stop()


def test_a_dead_hub_is_a_502_naming_it(creds, make_agent):
    dead = free_port()
    server = Server(make_agent({**creds.agent_config(timeout=5), "port": dead,
                                "connect_timeout": 2}))
    try:
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as failed:
                reply = server.client().chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hello"}], stream=stream)
                list(reply) if stream else None
            assert failed.value.status_code == 502
            assert f"127.0.0.1:{dead}" in failed.value.message
    finally:
        server.stop()


def test_twenty_conversations_at_once_without_cross_talk(served):
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{served.port}/v1",
                                api_key="unused", max_retries=0)

    async def turn(k, text):
        reply = await client.chat.completions.create(
            model="m", user=f"parallel-{k}", messages=[{"role": "user", "content": text}])
        return reply.choices[0].message.content

    async def main():
        await asyncio.gather(*(turn(k, f"remember word{k}") for k in range(20)))
        return await asyncio.gather(*(turn(k, "recall") for k in range(20)))
    assert asyncio.run(main()) == [f"you said word{k}" for k in range(20)]


def test_it_listens_beyond_loopback_only_with_a_key():
    check_exposure("127.0.0.1", Keys())
    check_exposure("::1", Keys())
    check_exposure("0.0.0.0", Keys(["key"]))
    with pytest.raises(ConfigurationError, match="--api-key"):
        check_exposure("0.0.0.0", Keys())


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_lets_the_answer_in_flight_finish_then_exits_zero(creds, stop):
    """SIGTERM (systemd, docker stop) or SIGINT (Ctrl-C): no new connection is taken, the
    streamed answer being sent ends whole, and the command exits 0."""
    port = free_port()
    proc = front_command("openai", "--uri", f"http://127.0.0.1:{port}", *hub_options(creds))
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat openai")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                               max_retries=0)
        chunks = iter(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "slow 3 0.5"}], stream=True))
        said = []
        for chunk in chunks:
            said.append(chunk.choices[0].delta.content or "")
            if "slow sentence 1" in said[-1]:
                break
        proc.send_signal(stop)              # two sentences still to come
        said += [chunk.choices[0].delta.content or "" for chunk in chunks]
        assert "".join(said) == "slow sentence 1\nslow sentence 2\nslow sentence 3"
        exited_cleanly(proc)
    finally:
        reap(proc)
