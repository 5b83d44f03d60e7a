"""Which OpenAI requests are a chat application's background tasks, and their answers, no I/O.

Open WebUI asks the chat's own model for a title, tags, follow-up suggestions, search queries,
an emoji and autocompletions; LibreChat for a title. Each such prompt quotes the user's
messages, so handed to an OVOS hub as an utterance it is a second command ("### Task: ...
turn on the heater": a skill may turn it on again) and the title comes back as "Sorry, I don't
understand". The OpenAI front answers them itself, without a turn, in the shape the client
parses (see `answer`).

How a request is recognised (`recognise`), in order:
1. a header naming the task: `X-OpenWebUI-Task` (Open WebUI fills it from `{{TASK}}` in a
   connection's custom headers; empty on an ordinary chat message) or `X-HiveMind-Task` (any
   other client). A header that is present decides: a known task name is that task; empty or
   unknown, the request is a chat and goes to the hub.
2. without either header, the last message matched against what Open WebUI's and LibreChat's
   default task prompts say (their instructions and the JSON they ask for). A custom prompt
   that says none of it is not recognised and goes to the hub: the header is the reliable way.

The answers hold nothing made up: a title is the first words of the conversation's first user
message; tags, follow-ups and queries are empty lists (Open WebUI then keeps its defaults and
skips a web search); autocompletion is empty text.
"""
import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Union

from hivemind_chat_agent.core.openai_conversations import content_text

OPEN_WEBUI_HEADER = "x-openwebui-task"
HIVEMIND_HEADER = "x-hivemind-task"
TITLE_WORDS = 5             # LibreChat asks for 5 words or fewer, Open WebUI for 2-4
TITLE_CHARS = 60
FALLBACK_TITLE = "New Chat"


class TaskKind(Enum):
    TITLE = "title"
    TAGS = "tags"
    FOLLOW_UPS = "follow_ups"
    QUERIES = "queries"
    EMOJI = "emoji"
    AUTOCOMPLETE = "autocomplete"
    TOOL_CALLS = "tool_calls"


class Shape(Enum):
    """How the asking client reads the answer."""
    JSON = "json"           # Open WebUI: the object between the first '{' and the last '}'
    TEXT = "text"           # LibreChat and plain clients: the content itself


@dataclass(frozen=True)
class Task:
    kind: TaskKind
    shape: Shape
    title_source: str       # the conversation's first user message, as the prompt quotes it


# Open WebUI's task names (open_webui/constants.py TASKS), and the generic header's own
_OPEN_WEBUI_NAMES = {
    "title_generation": TaskKind.TITLE, "tags_generation": TaskKind.TAGS,
    "follow_up_generation": TaskKind.FOLLOW_UPS, "query_generation": TaskKind.QUERIES,
    "emoji_generation": TaskKind.EMOJI, "autocomplete_generation": TaskKind.AUTOCOMPLETE,
    "function_calling": TaskKind.TOOL_CALLS,
}
_GENERIC_NAMES = {kind.value: kind for kind in TaskKind}


def _json_key(name: str) -> "re.Pattern[str]":
    return re.compile(r'"' + name + r'"\s*:')


# what a default prompt says, lower-cased: every pattern of one entry must be found
_OPEN_WEBUI_PROMPTS = (
    (TaskKind.AUTOCOMPLETE, ("autocompletion system", "<text>", _json_key("text"))),
    (TaskKind.TITLE, ("### task:", "<chat_history>", "title", _json_key("title"))),
    (TaskKind.TAGS, ("### task:", "<chat_history>", "tags", _json_key("tags"))),
    (TaskKind.FOLLOW_UPS, ("### task:", "<chat_history>", _json_key("follow_ups"))),
    (TaskKind.QUERIES, ("### task:", "<chat_history>", "search quer", _json_key("queries"))),
    (TaskKind.EMOJI, ("emoji", "facial expression", "message: ```")),
)
_LIBRECHAT_TITLE = ("5-word-or-less title for the conversation", "only return the title itself")


def recognise(messages: List[Dict[str, Any]], headers: Mapping[str, str]) -> Optional[Task]:
    """The background task these messages (a chat request's, the last one the new message)
    and headers (lower-case names) ask for, or None for a chat."""
    last = content_text(messages[-1].get("content")) if messages else ""
    for header, names, shape in ((OPEN_WEBUI_HEADER, _OPEN_WEBUI_NAMES, Shape.JSON),
                                 (HIVEMIND_HEADER, {**_OPEN_WEBUI_NAMES, **_GENERIC_NAMES},
                                  None)):
        if header in headers:
            kind = names.get(headers[header].strip().lower())
            if kind is None:
                return None
            if shape is None:       # the generic header: a title in plain text, the rest JSON
                shape = Shape.TEXT if kind in (TaskKind.TITLE, TaskKind.EMOJI) else Shape.JSON
            return Task(kind, shape, first_user_message(last, messages))
    said = last.lower()
    for kind, patterns in _OPEN_WEBUI_PROMPTS:
        if all(_found(p, said) for p in patterns):
            return Task(kind, Shape.JSON, first_user_message(last, messages))
    if all(p in said for p in _LIBRECHAT_TITLE):
        return Task(TaskKind.TITLE, Shape.TEXT, first_user_message(last, messages))
    return None


def _found(pattern: Union[str, "re.Pattern[str]"], text: str) -> bool:
    return pattern in text if isinstance(pattern, str) else pattern.search(text) is not None


_QUOTED_USER = re.compile(r"^\s*user:\s*(.+)$", re.IGNORECASE | re.MULTILINE)


def first_user_message(prompt: str, messages: List[Dict[str, Any]]) -> str:
    """The first user message the prompt quotes (Open WebUI's "USER: ..." lines in
    <chat_history>, LibreChat's "User: ..." after "Conversation:"), else the request's first
    user message before the prompt; "" when there is none."""
    quoted = prompt
    for opening in ("<chat_history>", "conversation:"):
        at = quoted.lower().find(opening)
        if at >= 0:
            quoted = quoted[at + len(opening):]
            found = _QUOTED_USER.search(quoted)
            if found:
                return found.group(1).strip()
    for message in messages[:-1]:
        if message.get("role") == "user":
            text = content_text(message.get("content")).strip()
            if text:
                return text
    return ""


def title_of(text: str) -> str:
    """A short title from a user message: its first words (punctuation, quotes and emojis
    left out), first letters upper-case."""
    words = [w.strip("'’-") for w in _WORD.findall(text)][:TITLE_WORDS]
    title = " ".join(w[:1].upper() + w[1:] for w in words if w)[:TITLE_CHARS]
    return title.strip() or FALLBACK_TITLE


_WORD = re.compile(r"[^\W_][\w'’-]*")


_EMPTY_JSON = {TaskKind.TAGS: {"tags": []}, TaskKind.FOLLOW_UPS: {"follow_ups": []},
               TaskKind.QUERIES: {"queries": []}, TaskKind.AUTOCOMPLETE: {"text": ""},
               TaskKind.TOOL_CALLS: {"tool_calls": []}}
NEUTRAL_EMOJI = "\N{SLIGHTLY SMILING FACE}"


def answer(task: Task) -> str:
    """The assistant message's content that answers `task` as its client parses it:
    Open WebUI `{"title": ...}`, `{"tags": []}`, `{"follow_ups": []}`, `{"queries": []}`,
    `{"text": ""}`, `{"tool_calls": []}` and an emoji; LibreChat (and the generic header's
    `title`) the title alone."""
    if task.kind is TaskKind.TITLE:
        title = title_of(task.title_source)
        return title if task.shape is Shape.TEXT else json.dumps({"title": title})
    if task.kind is TaskKind.EMOJI:
        return NEUTRAL_EMOJI
    return json.dumps(_EMPTY_JSON[task.kind])
