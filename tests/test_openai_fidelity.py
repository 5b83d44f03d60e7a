"""`hivemind-chat openai` as real clients use it, against genuine hubs of both generations
running our plugin with tests/engines.py's ScriptEngine, which records every utterance it is
asked ("asked"): Open WebUI's and LibreChat's background tasks (their real default prompts,
tests/data) never reach the hub and each answer parses as that client parses it; usage is
counted, and `stream_options.include_usage` gets one usage chunk; `responses.create` plain
and streamed, continued by `previous_response_id` or `conversation` (the official `openai`
client)."""
import json

import openai
import pytest
from fronts import running, say
from hubs import HubProcess, hub_generations, plugin_config
from task_prompts import (
    OPEN_WEBUI_TASKS,
    librechat_title_prompt,
    open_webui_parse,
    open_webui_prompt,
)

from hivemind_chat_agent.core.usage import count_tokens

pytestmark = pytest.mark.hub

CHAT = [("user", "turn on the heater"), ("assistant", "you said turn on the heater")]


@pytest.fixture(scope="module", params=hub_generations())
def script_hub(request):
    hub = HubProcess(plugin_config(timeout=10, workers=4), generation=request.param).start()
    yield hub
    hub.cleanup()


@pytest.fixture
def front(script_hub, make_agent):
    with running(make_agent(script_hub.add_client().agent_config(timeout=10))) as server:
        yield server


def asked(client):
    """What the hub's engine was asked so far (these questions themselves left out)."""
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "asked"}], user="probe")
    return [text for text in json.loads(reply.choices[0].message.content) if text != "asked"]


def ask(client, text, headers=None, stream=False):
    """The assistant's content for one user message, plain or streamed."""
    kw = {"extra_headers": headers} if headers else {}
    messages = [{"role": "user", "content": text}]
    if not stream:
        reply = client.chat.completions.create(model="m", messages=messages, **kw)
        return reply.choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=messages, stream=True, **kw) if c.choices)


def test_background_tasks_never_reach_the_hub_and_parse_as_their_clients_parse(front):
    client = front.client()
    before = asked(client)
    assert ask(client, CHAT[0][1]) == CHAT[1][1]                  # the chat itself: a turn
    for task in sorted(OPEN_WEBUI_TASKS):
        prompt = open_webui_prompt(task, CHAT)
        for headers in (None, {"X-OpenWebUI-Task": task}):
            for stream in (False, True):
                parsed = open_webui_parse(task, ask(client, prompt, headers, stream))
                if task == "title_generation":
                    assert parsed == "Turn On The Heater", (headers, stream)
                elif task == "emoji_generation":
                    assert parsed and len(parsed) <= 2
                else:
                    assert parsed in ([], ""), (task, headers, parsed)
    # Open WebUI with its task header on: an ordinary chat message carries it empty
    assert ask(client, "hello", {"X-OpenWebUI-Task": ""}) == "hello there"
    librechat = ask(client, librechat_title_prompt("turn on the heater",
                                                   "you said turn on the heater"))
    assert librechat == "Turn On The Heater"      # LibreChat takes the content as the title
    titled = client.chat.completions.create(
        model="m", extra_headers={"X-HiveMind-Task": "title"},
        messages=[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                  {"role": "user", "content": "a title"}])
    assert titled.choices[0].message.content == "Hello"
    # a custom task prompt the server cannot recognise goes to the hub
    custom = "Summarise this chat in one line: USER: turn on the heater"
    assert ask(client, custom) == f"you said {custom}"
    assert asked(client)[len(before):] == [CHAT[0][1], "hello", custom]


def test_usage_is_counted_and_include_usage_sends_one_last_usage_chunk(front):
    client = front.client()
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "count 3"}]
    plain = client.chat.completions.create(model="m", messages=messages)
    answer = plain.choices[0].message.content
    assert answer == "sentence 1\nsentence 2\nsentence 3"
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens,
            plain.usage.total_tokens) == (4, 6, 10) == (
        count_tokens("be brief") + count_tokens("count 3"), count_tokens(answer), 10)
    chunks = list(client.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}))
    with_usage = [c for c in chunks if c.usage is not None]
    assert with_usage == [chunks[-1]] and chunks[-1].choices == []
    assert chunks[-1].usage.model_dump(include={"prompt_tokens", "completion_tokens",
                                                "total_tokens"}) == \
        {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    without = list(client.chat.completions.create(model="m", messages=messages, stream=True))
    assert all(c.usage is None for c in without) and all(c.choices for c in without)


def events_of(stream):
    events = list(stream)
    return [e.type for e in events], events


def test_responses_plain_and_streamed_say_the_same_in_the_semantic_events(front):
    client = front.client()
    plain = client.responses.create(model="gpt-4o", input="count 3",
                                    instructions="be brief", temperature=0.2,
                                    tools=[{"type": "function", "name": "f", "parameters": {}}])
    assert plain.object == "response" and plain.status == "completed"
    assert plain.model == "gpt-4o" and plain.output_text == "sentence 1\nsentence 2\nsentence 3"
    assert (plain.usage.input_tokens, plain.usage.output_tokens) == (
        count_tokens("count 3") + count_tokens("be brief"), count_tokens(plain.output_text))
    kinds, events = events_of(client.responses.create(
        model="m", stream=True,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "count 3"}]}]))
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"] + ["response.output_text.delta"] * 3 + [
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[kinds.index("response.output_text.done")].text
    assert deltas == done == events[-1].response.output_text == plain.output_text
    assert events[0].response.id == events[-1].response.id != plain.id


def test_previous_response_id_remembers_and_two_conversations_stay_apart(front):
    client = front.client()
    ada = client.responses.create(model="m", input="remember ada")
    bob = client.responses.create(model="m", input="remember bob")
    assert client.responses.create(model="m", input="recall",
                                   previous_response_id=ada.id).output_text == "you said ada"
    streamed = client.responses.create(model="m", input="recall", stream=True,
                                       previous_response_id=bob.id)
    assert [e for e in streamed if e.type == "response.completed"][0].response.output_text \
        == "you said bob"
    for name, word in (("conv_a", "cat"), ("conv_b", "dog")):
        client.responses.create(model="m", input=f"remember {word}", conversation=name)
    assert client.responses.create(model="m", input="recall",
                                   conversation={"id": "conv_a"}).output_text == "you said cat"
    assert client.responses.create(model="m", input="recall",
                                   conversation="conv_b").output_text == "you said dog"


def test_continuing_an_older_response_forks_from_the_state_saved_there(front):
    """The chat API's forking rule: a session that answered since is never joined; the fork
    starts from the Session (what skills keep in it) as it was at that response, in the hub's
    own format (a 4.0 hub's context frames, re-serialized by the client's newer
    ovos-bus-client, lost their keys: the fork said "no notes")."""
    client = front.client()
    tea = client.responses.create(model="m", input="note tea")
    milk = client.responses.create(model="m", input="note milk", previous_response_id=tea.id)
    forked = client.responses.create(model="m", input="notes", previous_response_id=tea.id)
    assert forked.output_text == "notes: tea"
    live = client.responses.create(model="m", input="notes", previous_response_id=milk.id)
    assert live.output_text == "notes: milk, tea"
    again = client.responses.create(model="m", input="notes", previous_response_id=live.id)
    assert again.output_text == "notes: milk, tea"          # the latest continues in place


def test_responses_errors_are_openai_error_objects_and_tasks_stay_off_the_hub(front):
    client = front.client()
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="m", input="recall", previous_response_id="resp_nope")
    assert unknown.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input="recall", previous_response_id="resp_x",
                                conversation="c")
    with pytest.raises(openai.BadRequestError) as no_user:
        client.responses.create(model="m", input=[{"role": "assistant", "content": "hi"}])
    assert no_user.value.code == "invalid_input"
    before = asked(client)
    title = client.responses.create(model="m", input=open_webui_prompt("title_generation", CHAT),
                                    extra_headers={"X-OpenWebUI-Task": "title_generation"})
    assert open_webui_parse("title_generation", title.output_text) == "Turn On The Heater"
    assert asked(client) == before


def test_responses_take_the_same_keys_and_fail_as_the_chat_api_does(script_hub, make_agent):
    """The guard counts /v1/responses as a turn path (keys, caps); a hub with no answer is
    the chat API's 502 error object, plain or streamed (before the first event)."""
    agent = make_agent(script_hub.add_client().agent_config(timeout=10))
    with running(agent, api_keys=["s3cret"]) as server:
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").responses.create(model="m", input="hello")
        client = server.client(api_key="s3cret")
        assert client.responses.create(model="m", input="hello").output_text == "hello there"
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as failed:
                reply = client.responses.create(model="m", input="empty", stream=stream)
                list(reply) if stream else None
            assert failed.value.status_code == 502 and failed.value.code == "not_understood"


def test_a_chat_history_ending_at_an_older_answer_forks_with_the_state_saved_there(front):
    """The same forking rule in chat completions, the state a skill kept in the Session
    carried into the fork on both generations."""
    client = front.client()
    assert say(client, "note tea") == "noted"
    assert say(client, "note tea", "noted", "note milk") == "noted"
    assert say(client, "note tea", "noted", "notes") == "notes: tea"           # a fork
    assert say(client, "note tea", "noted", "note milk", "noted", "notes") == \
        "notes: milk, tea"                                                     # the live chat
