"""core/background_tasks: Open WebUI's and LibreChat's background prompts recognised, chats
not, and each answer in the shape its client parses (no I/O; the real-hub test is in
test_openai_server.py)."""
import pytest
from task_prompts import (
    OPEN_WEBUI_TASKS,
    librechat_title_prompt,
    open_webui_parse,
    open_webui_prompt,
)

from hivemind_chat_agent.core.background_tasks import (
    FALLBACK_TITLE,
    Shape,
    TaskKind,
    answer,
    recognise,
    title_of,
)
from hivemind_chat_agent.core.usage import count_tokens, usage

CHAT = [("user", "turn on the heater in the kitchen please"),
        ("assistant", "the kitchen heater is on")]
EXPECTED = {"title_generation": "Turn On The Heater In", "tags_generation": [],
            "follow_up_generation": [], "query_generation": [],
            "autocomplete_generation": ""}


def user(text):
    return {"role": "user", "content": text}


@pytest.mark.parametrize("task", sorted(OPEN_WEBUI_TASKS))
@pytest.mark.parametrize("header", [None, "x-openwebui-task"])
def test_open_webui_default_prompts_are_answered_as_open_webui_parses(task, header):
    messages = [user(open_webui_prompt(task, CHAT))]
    found = recognise(messages, {header: task} if header else {})
    assert found is not None and found.shape is Shape.JSON
    parsed = open_webui_parse(task, answer(found))
    if task == "emoji_generation":
        assert parsed and len(parsed) <= 2
    else:
        assert parsed == EXPECTED[task]


def test_librechat_title_prompt_is_answered_with_a_plain_title():
    found = recognise([user(librechat_title_prompt("what is the weather in Lisbon",
                                                   "sunny, 20 degrees"))], {})
    assert found is not None and found.kind is TaskKind.TITLE
    assert answer(found) == "What Is The Weather In"


def test_an_empty_or_unknown_header_means_a_chat_even_for_a_task_like_prompt():
    prompt = [user(open_webui_prompt("title_generation", CHAT))]
    assert recognise(prompt, {"x-openwebui-task": ""}) is None
    assert recognise(prompt, {"x-openwebui-task": "moa_response_generation"}) is None
    assert recognise([user("turn on the heater")], {"x-openwebui-task": ""}) is None


def test_ordinary_chats_and_custom_prompts_are_not_tasks():
    for text in ("turn on the heater", "what is the title of that song",
                 "tag this photo: my cat", "### Task: summarise this for me",
                 "Give me a title for my essay about dogs"):
        assert recognise([user(text)], {}) is None, text


def test_the_generic_header_names_a_task_for_any_client():
    history = [user("set a timer for ten minutes"), {"role": "assistant", "content": "done"},
               user("name this chat")]
    title = recognise(history, {"x-hivemind-task": "title"})
    assert title is not None and title.shape is Shape.TEXT
    assert answer(title) == "Set A Timer For Ten"
    assert answer(recognise(history, {"x-hivemind-task": "tags"})) == '{"tags": []}'
    assert answer(recognise(history, {"x-hivemind-task": "follow_up_generation"})) == \
        '{"follow_ups": []}'
    assert recognise(history, {"x-hivemind-task": "chat"}) is None


def test_titles_are_short_and_plain():
    assert title_of('"Hello", (world)!  how are you today, friend?') == "Hello World How Are You"
    assert title_of("") == title_of("?!") == FALLBACK_TITLE
    assert len(title_of("x" * 500)) <= 60


def test_usage_counts_words_and_marks_the_same_way_for_prompt_and_answer():
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("") == 0 and count_tokens("  ") == 0
    assert usage(["you are helpful", "hello"], "hello there") == {
        "prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
