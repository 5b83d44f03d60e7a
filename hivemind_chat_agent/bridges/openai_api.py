"""The OpenAI chat completions API's logic in front of `HiveMindChatAgent`, framework-free
(`OpenAIBridge`: a request body in, an answer or SSE lines out), so Open WebUI, LibreChat, n8n,
LangChain or the `openai` client talk to an OVOS hub. Its HTTP server, `hivemind-chat openai`,
is bridges/openai_http.py (Starlette and uvicorn, extra `[openai]`). Each request's latest
user message is the utterance; the hub keeps the conversation in its OVOS Session, so which
session a request continues is decided by core/openai_conversations.ConversationIndex (a
header, the body's `user`, or its history), and a session's state is read and seeded through
the agent (`session_snapshot`, `seed_session`), never in OVOS's SessionManager directly.

    GET  /v1/models              one model, "hivemind-chat" (any model name is accepted)
    POST /v1/chat/completions    plain or `stream: true` (SSE chunks, then `data: [DONE]`)
    POST /v1/responses           bridges/openai_responses.py, through this bridge's turns

A chat app's background task (a title, tags ...: core/background_tasks) is answered here
without a turn; `usage` is counted by core/usage's rule.

Who may call it (Host, Origin, keys, caps) is bridges/http_front's and core/front_guard's
business: a request reaches this bridge with its caller named. Errors are OpenAI error objects
naming what happened (the unreachable hub, the timeout) with 400, 502, 503 or 504; what the
agent's own message says (addresses, file paths) goes to the server's log, not to the client.
"""
import json
import time
import uuid
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

from ovos_utils.log import LOG

from hivemind_chat_agent.bridges.hub_failures import hub_address, hub_failure
from hivemind_chat_agent.core import background_tasks
from hivemind_chat_agent.core.openai_conversations import (
    Continuation,
    ConversationIndex,
    content_text,
)
from hivemind_chat_agent.core.outcomes import TurnStatus
from hivemind_chat_agent.core.usage import usage
from hivemind_chat_agent.errors import HiveMindChatError

MODEL = "hivemind-chat"


class APIError(Exception):
    """An OpenAI error object to answer with."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": None,
                          "code": self.code}}


def hub_error(e: HiveMindChatError, hub: str) -> APIError:
    """The agent's typed error as the OpenAI error object bridges/hub_failures makes of it."""
    failure = hub_failure(e, hub)
    return APIError(failure.status, failure.message, failure.kind, failure.code)


def utterance_of(body: Any) -> Tuple[str, List[Dict[str, Any]]]:
    """The new utterance (the last message, a user's) and the messages; APIError 400 if the
    body is not a chat request."""
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    return last_user_text(body.get("messages"), "messages", "invalid_messages"), \
        body["messages"]


def last_user_text(messages: Any, field: str, code: str) -> str:
    """The text of the last of `messages`, which must be the user's: what every front of
    this API sends the hub as the utterance; APIError 400 naming `field` otherwise."""
    if not isinstance(messages, list) or not messages or \
            not all(isinstance(m, dict) for m in messages):
        raise APIError(400, f"'{field}' must be a non-empty list of message objects",
                       code=code)
    last = messages[-1]
    text = content_text(last.get("content")).strip()
    if last.get("role") != "user" or not text:
        raise APIError(400, f"the last message of '{field}' must be the user's, with text",
                       code=code)
    return text


class OpenAIBridge:
    """The API's logic, framework-free: an admitted caller's request body and headers in, an
    answer or a stream of chunks out. `caller` names whose conversations these are (one per
    API key, see core/front_guard.Keys)."""

    def __init__(self, agent, index: Optional[ConversationIndex] = None):
        self.agent = agent
        self.index = index or ConversationIndex()
        self.hub = hub_address(agent)

    def continuation(self, key: str, headers: Dict[str, str], body: Dict[str, Any],
                     messages: List[Dict[str, Any]]) -> Continuation:
        """Which session the request continues; a fork of a known conversation starts from
        that conversation's state (the agent seeds it, unless it knows the session already)."""
        where = self.index.continuation(key, headers, body.get("user"), messages)
        if where.start_from is not None:
            self.agent.seed_session(where.session_id, where.start_from)
        return where

    async def sentences(self, text: str, where: Continuation) -> AsyncIterator[str]:
        """The hub's sentences; APIError when it failed before saying anything. Closed or
        cancelled before the end (the caller hung up), the turn is stopped at the hub."""
        try:
            turn = await self.agent.abegin([{"role": "user", "content": text}],
                                           session_id=where.session_id)
        except HiveMindChatError as e:
            raise hub_error(e, self.hub) from None
        said = 0
        try:
            async for sentence in turn:
                said += 1
                yield sentence
        except HiveMindChatError as e:
            if not said:
                raise hub_error(e, self.hub) from None
            LOG.warning(f"an answer ended early: {type(e).__name__}: {e}")
            return
        finally:
            turn.terminate()        # a no-op once the turn has ended
        if not said:
            if turn.status is TurnStatus.TIMED_OUT:
                raise APIError(504, "the OVOS hub did not answer in time", "timeout", "timeout")
            raise APIError(502, "the OVOS hub had no answer for this utterance",
                           "server_error", "not_understood")

    def remember(self, key: str, where: Continuation, messages: List[Dict[str, Any]],
                 answer: str) -> None:
        if where.named:     # found by its name; an earlier answer's id now forks
            self.index.moved_on(where.session_id)
            return
        self.index.answered(key, where.session_id, messages, answer,
                            self.agent.session_snapshot(where.session_id))

    async def complete(self, caller: str, headers: Dict[str, str], body: Any) -> Dict[str, Any]:
        """The answer as one chat.completion; a background task (core/background_tasks) is
        answered here, without a turn."""
        text, messages = utterance_of(body)
        task = background_tasks.recognise(messages, headers)
        if task is not None:
            answer = background_tasks.answer(task)
        else:
            where = self.continuation(caller, headers, body, messages)
            answer = "\n".join([s async for s in self.sentences(text, where)])
            self.remember(caller, where, messages, answer)
        return {"id": completion_id(), "object": "chat.completion", "created": int(time.time()),
                "model": model_of(body),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": answer}}],
                "usage": usage(prompt_texts(messages), answer)}

    async def stream(self, caller: str, headers: Dict[str, str],
                     body: Any) -> AsyncIterator[str]:
        """SSE `data:` lines: the role, one chunk per sentence, the finish, with
        `stream_options.include_usage` a last chunk with `choices: []` and the usage, then
        `[DONE]`. Raises APIError only before the first line (then the response is an error
        object). A background task is answered in one chunk, without a turn."""
        text, messages = utterance_of(body)
        chunk = chunk_maker(model_of(body))
        task = background_tasks.recognise(messages, headers)
        where: Optional[Continuation] = None
        if task is not None:
            sentences = one(background_tasks.answer(task))
        else:
            where = self.continuation(caller, headers, body, messages)
            sentences = self.sentences(text, where)
        said: List[str] = []
        try:
            first = await sentences.__anext__()
        except StopAsyncIteration:
            first = None
        role = sse(chunk({"role": "assistant", "content": ""}))
        try:
            if first is None:
                yield role
            else:     # one write: the client reads the role and the sentence together
                said.append(first)
                yield role + sse(chunk({"content": first}))
                async for sentence in sentences:
                    said.append(sentence)
                    yield sse(chunk({"content": "\n" + sentence}))
        except APIError as e:       # after the headers: an error chunk, as OpenAI sends it
            yield sse(e.body())
        finally:
            await sentences.aclose()   # type: ignore[attr-defined]  # an async generator
        answer = "\n".join(said)
        yield sse(chunk({}, finish="stop"))
        if wants_usage(body):
            yield sse(dict(chunk({}), choices=[], usage=usage(prompt_texts(messages), answer)))
        yield "data: [DONE]\n\n"
        if where is not None:
            self.remember(caller, where, messages, answer)


async def one(text: str) -> AsyncIterator[str]:
    yield text


def prompt_texts(messages: List[Dict[str, Any]]) -> List[str]:
    """What core/usage counts as the prompt: every message's text."""
    return [content_text(m.get("content")) for m in messages]


def wants_usage(body: Dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def model_of(body: Dict[str, Any]) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else MODEL


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def chunk_maker(model: str):
    cid, created = completion_id(), int(time.time())

    def chunk(delta: Dict[str, Any], finish: Optional[str] = None) -> Dict[str, Any]:
        return {"id": cid, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [{"index": 0, "delta": delta,
                                             "finish_reason": finish}]}
    return chunk


def sse(data: Dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def models() -> Dict[str, Any]:
    return {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                        "owned_by": "hivemind"}]}


async def first_line(lines: AsyncIterator[str]) -> Tuple[Optional[str], AsyncIterator[str]]:
    """Run a stream to its first line, so an error before it can still be a status code."""
    try:
        return await lines.__anext__(), lines
    except StopAsyncIteration:
        return None, lines

