"""The OpenAI Responses API (`POST /v1/responses`) in front of the same agent, the subset its
clients use (n8n's OpenAI Chat Model node, Open WebUI's and LibreChat's Responses connections,
the `openai` client's `responses.create`), framework-free like bridges/openai_api.py, whose
`OpenAIBridge` it runs every turn through: the same utterance rule, sessions, background
tasks, usage and errors.

- `input`: a string (one user message) or a list of items; messages (`{"role", "content"}`,
  content a string or `input_text`/`output_text` parts) count, other items are skipped. The
  last message must be the user's: its text is the utterance.
- `instructions`, `tools`, `tool_choice`, `temperature`, `store`, ... are accepted and ignored
  (the hub decides the answer); `instructions` is counted in the usage's input.
- Which conversation: `conversation` (an id, or `{"id": ...}`) names one, as the chat API's
  `X-Conversation-Id` does; `previous_response_id` continues the session that gave that
  response, or forks from the state saved at it when the session has answered since
  (core/openai_conversations); both at once is a 400; an id this caller was never given is a
  404. Without either, the chat API's rules apply (headers, `user`, the history).
- `stream: true`: Server-Sent Events, each `event: <type>` with its JSON: response.created,
  response.in_progress, response.output_item.added, response.content_part.added, one
  response.output_text.delta per sentence, response.output_text.done,
  response.content_part.done, response.output_item.done, response.completed. A failure after
  the first sentence ends with response.failed. As in the chat API, the headers wait for the
  first sentence, so a hub that fails before saying anything is an error status.
"""
import json
import time
import uuid
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

from hivemind_chat_agent.bridges.openai_api import (
    APIError,
    OpenAIBridge,
    last_user_text,
    model_of,
    one,
    prompt_texts,
)
from hivemind_chat_agent.core import background_tasks
from hivemind_chat_agent.core.openai_conversations import Continuation
from hivemind_chat_agent.core.usage import usage

CODE = "invalid_input"


def input_messages(body: Any) -> Tuple[str, List[Dict[str, Any]]]:
    """The utterance and the request's messages (chat-completions shaped) from `input`."""
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    given = body.get("input")
    if isinstance(given, str):
        messages: Any = [{"role": "user", "content": given}]
    elif isinstance(given, list) and all(isinstance(item, dict) for item in given):
        messages = [{"role": item.get("role"), "content": item.get("content")}
                    for item in given if item.get("type", "message") == "message"]
    else:
        messages = None
    return last_user_text(messages, "input", CODE), messages


def conversation_of(body: Dict[str, Any]) -> Optional[str]:
    given = body.get("conversation")
    if isinstance(given, dict):
        given = given.get("id")
    if given is None:
        return None
    if not isinstance(given, str) or not given.strip():
        raise APIError(400, "'conversation' must be an id or {\"id\": ...}", code=CODE)
    return given.strip()


class ResponsesAPI:
    """`POST /v1/responses` for an admitted caller, through `bridge`'s turns and sessions."""

    def __init__(self, bridge: OpenAIBridge):
        self.bridge = bridge

    def continuation(self, caller: str, headers: Dict[str, str], body: Dict[str, Any],
                     messages: List[Dict[str, Any]]) -> Continuation:
        conversation, previous = conversation_of(body), body.get("previous_response_id")
        if conversation is not None and previous is not None:
            raise APIError(400, "give 'conversation' or 'previous_response_id', not both",
                           code=CODE)
        index = self.bridge.index
        if conversation is not None:
            return index.named(caller, f"conversation:{conversation[:200]}")
        if previous is None:
            return self.bridge.continuation(caller, headers, body, messages)
        where = index.after_response(caller, previous) if isinstance(previous, str) else None
        if where is None:
            raise APIError(404, f"Previous response with id '{str(previous)[:100]}' not found.",
                           code="previous_response_not_found")
        if where.start_from is not None:
            self.bridge.agent.seed_session(where.session_id, where.start_from)
        return where

    def _begin(self, caller: str, headers: Dict[str, str], body: Any):
        """The turn's sentences (a background task's answer without a turn), its session
        (None for a task) and the response's shell."""
        text, messages = input_messages(body)
        shell = Shell(body, messages)
        task = background_tasks.recognise(messages, headers)
        if task is not None:
            return one(background_tasks.answer(task)), None, shell
        where = self.continuation(caller, headers, body, messages)
        return self.bridge.sentences(text, where), where, shell

    def _remember(self, caller: str, where: Optional[Continuation], shell: "Shell",
                  answer: str) -> None:
        if where is None:
            return
        self.bridge.index.answered(caller, where.session_id,
                                   None if where.named else shell.messages, answer,
                                   self.bridge.agent.session_snapshot(where.session_id),
                                   response_id=shell.id)

    async def create(self, caller: str, headers: Dict[str, str], body: Any) -> Dict[str, Any]:
        sentences, where, shell = self._begin(caller, headers, body)
        answer = "\n".join([s async for s in sentences])
        self._remember(caller, where, shell, answer)
        return shell.response("completed", answer)

    async def stream(self, caller: str, headers: Dict[str, str],
                     body: Any) -> AsyncIterator[str]:
        """The semantic events; APIError only before the first one."""
        sentences, where, shell = self._begin(caller, headers, body)
        try:
            first = await sentences.__anext__()
        except StopAsyncIteration:
            first = ""
        said = [first]
        try:
            yield "".join(shell.opening(first))     # one write, with the first sentence
            async for sentence in sentences:
                said.append(sentence)
                yield shell.delta("\n" + sentence)
        except APIError as e:           # after the headers: the response failed
            yield shell.event("response.failed", response=shell.response(
                "failed", "\n".join(said), error={"code": e.code or e.kind,
                                                  "message": e.message}))
            return
        finally:
            await sentences.aclose()
        answer = "\n".join(said)
        yield "".join(shell.closing(answer))
        self._remember(caller, where, shell, answer)


class Shell:
    """One response's ids, echoed fields and event numbering."""

    def __init__(self, body: Dict[str, Any], messages: List[Dict[str, Any]]):
        self.id, self.item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self.created, self.model = int(time.time()), model_of(body)
        self.messages = messages
        instructions = body.get("instructions")
        self.instructions = instructions if isinstance(instructions, str) else None
        self.previous = body.get("previous_response_id")
        conversation = conversation_of(body)
        self.conversation = {"id": conversation} if conversation else None
        self.metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        self.sequence = 0

    def usage(self, answer: str) -> Dict[str, Any]:
        counted = usage(prompt_texts(self.messages) + [self.instructions or ""], answer)
        return {"input_tokens": counted["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": counted["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counted["total_tokens"]}

    def message(self, status: str, text: Optional[str]) -> Dict[str, Any]:
        content = [] if text is None else [self.part(text)]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": content}

    @staticmethod
    def part(text: str) -> Dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def response(self, status: str, text: Optional[str] = None,
                 error: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        done = status != "in_progress"
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": status, "error": error, "incomplete_details": None,
                "instructions": self.instructions, "model": self.model,
                "output": [self.message(status, text)] if done else [],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                "previous_response_id": self.previous, "conversation": self.conversation,
                "metadata": self.metadata, "store": True,
                "usage": self.usage(text or "") if done else None}

    def at_text(self) -> Dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    def opening(self, first: str) -> List[str]:
        events = [self.event("response.created", response=self.response("in_progress")),
                  self.event("response.in_progress", response=self.response("in_progress")),
                  self.event("response.output_item.added", output_index=0,
                             item=self.message("in_progress", None)),
                  self.event("response.content_part.added", part=self.part(""),
                             **self.at_text())]
        if first:
            events.append(self.delta(first))
        return events

    def delta(self, text: str) -> str:
        return self.event("response.output_text.delta", delta=text, logprobs=[],
                          **self.at_text())

    def closing(self, answer: str) -> List[str]:
        return [self.event("response.output_text.done", text=answer, logprobs=[],
                           **self.at_text()),
                self.event("response.content_part.done", part=self.part(answer),
                           **self.at_text()),
                self.event("response.output_item.done", output_index=0,
                           item=self.message("completed", answer)),
                self.event("response.completed", response=self.response("completed", answer))]

