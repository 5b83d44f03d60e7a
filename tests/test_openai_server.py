"""`hivemind-chat openai` driven by the official `openai` client, against genuine hubs of both
generations (the OVOS-like test pipeline: tests/pipeline_agent.py)."""
import asyncio
import threading

import openai
import pytest
from hubs import free_port, wait_listening

from hivemind_chat_agent.bridges.http_front import Limits
from hivemind_chat_agent.bridges.openai_http import check_exposure, serve
from hivemind_chat_agent.bridges.openai_server import OpenAIBridge
from hivemind_chat_agent.core.front_guard import FrontGuard, Keys
from hivemind_chat_agent.errors import ConfigurationError


class Server:
    """serve() on an event loop of its own thread, as `hivemind-chat openai` runs it.
    `api_keys`: the keys it accepts (none: loopback without keys); `host`: where it binds;
    `guard` options and `limits` as the command line gives them."""

    def __init__(self, agent, api_keys=(), host="127.0.0.1", limits=Limits(), **guard):
        self.port = free_port()
        self.host = host
        self.bridge = OpenAIBridge(agent)
        self.guard = FrontGuard(host, Keys(api_keys), what="OpenAI API server", **guard)
        self._server = None
        self.thread = threading.Thread(target=lambda: asyncio.run(serve(
            self.bridge, host, self.port, self.guard, limits, started=self._started)),
            daemon=True)
        self.thread.start()
        wait_listening(self.port, 10, what="the OpenAI server", host=host)

    def _started(self, server):
        self._server = server

    def client(self, api_key="unused", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://{self.host}:{self.port}/v1", api_key=api_key,
                             max_retries=0, **kw)

    def stop(self):
        if self._server is not None:
            self._server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(creds, make_agent):
    server = Server(make_agent(creds.agent_config(timeout=5)))
    yield server
    server.stop()


def say(client, *messages, **kw) -> str:
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
               for i, text in enumerate(messages)]
    reply = client.chat.completions.create(model="anything", messages=history, **kw)
    return reply.choices[0].message.content


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
