"""Which OVOS conversation an OpenAI chat request continues, with no I/O.

OpenAI clients send the whole history with every request and usually no conversation id, while
the hub keeps a conversation in its OVOS Session: a request must be mapped to one session id.
In order of precedence:

1. a name the client gives: the `X-OpenWebUI-Chat-Id` header (Open WebUI with its user-info
   headers on), `X-Conversation-Id` (LibreChat's custom headers, scripts), the body's `user`
   (the Responses API's `conversation` too, through `named`).
   A named conversation continues from its name alone, whatever history the request carries.
2. the history itself: for every answer given, `ConversationIndex` remembers a digest of the
   conversation up to and including that answer, with the Session as it was then. A request
   whose earlier messages end at a session's *latest* answer continues that session. One that
   ends at an older answer (a chat edited or regenerated from there, or someone replaying
   another chat's opening) forks: a session of its own, started from the state saved at that
   answer, never the live one. Two chats that began alike (same question, same answer) share a
   digest; a request matching both forks the same way, from their common state.
   The Responses API's `previous_response_id` follows the same rule with the response's id in
   place of the history (`after_response`).
3. anything else starts a new session.

Sessions are per caller (each API key is one: one key never reaches another's conversations),
digests are keyed hashes of the messages, and the index is bounded (least recently used
forgotten first).
"""
import hashlib
import hmac
import json
import secrets
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

NAME_HEADERS = ("x-openwebui-chat-id", "x-conversation-id")
MAX_NAME = 200          # characters of a client-given conversation name that count


@dataclass(frozen=True)
class Continuation:
    """The session a request runs in; `start_from` is the serialized Session a new one copies
    (the common state of several conversations it matched), None to start afresh."""
    session_id: str
    start_from: Optional[Dict[str, Any]] = None
    named: bool = False


@dataclass
class _Answered:
    sessions: List[str]
    state: Optional[Dict[str, Any]]


class ConversationIndex:
    def __init__(self, max_entries: int = 10000, secret: Optional[bytes] = None):
        self.max_entries = max_entries
        self._secret = secret or secrets.token_bytes(32)
        self._answered: "OrderedDict[str, _Answered]" = OrderedDict()
        # session -> the digests of its latest answer (its history's, its response id's)
        self._latest: "OrderedDict[str, Tuple[str, ...]]" = OrderedDict()

    def continuation(self, caller: str, headers: Mapping[str, str], user: Any,
                     messages: List[Dict[str, Any]]) -> Continuation:
        """Where the request of `caller` with these `headers` (lower-case names), body `user`
        and `messages` (the last one: the new utterance) continues."""
        name = client_name(headers, user)
        if name is not None:
            return self.named(caller, name)
        earlier = messages[:-1]
        if earlier:
            found = self._after(self._digest(caller, earlier))
            if found is not None:
                return found
        return Continuation(new_session_id())

    def named(self, caller: str, name: str) -> Continuation:
        """The conversation `caller` calls `name`: the same session whenever it is named."""
        return Continuation(self._session_id(caller, "name", name), named=True)

    def after_response(self, caller: str, response_id: str) -> Optional[Continuation]:
        """Where a request continuing the answer `response_id` runs (the Responses API's
        `previous_response_id`), by the same rule as a history: that session if it is the
        session's latest answer, else a fork from the state saved at it. None for an id this
        caller was never given (or one forgotten)."""
        return self._after(self._response_digest(caller, response_id))

    def _after(self, digest: str) -> Optional[Continuation]:
        entry = self._answered.get(digest)
        if entry is None:
            return None
        self._answered.move_to_end(digest)
        if len(set(entry.sessions)) == 1 and \
                digest in self._latest.get(entry.sessions[0], ()):
            return Continuation(entry.sessions[0])
        return Continuation(new_session_id(), start_from=entry.state)

    def answered(self, caller: str, session_id: str, messages: Optional[List[Dict[str, Any]]],
                 answer: str, state: Optional[Dict[str, Any]] = None,
                 response_id: Optional[str] = None) -> None:
        """`session_id` answered `messages` with `answer` (as `response_id`, if it has one);
        `state`: its Session after it. `messages` None: remember the response id alone (a
        named conversation is found by its name, not its history)."""
        keys = []
        if messages is not None:
            history = list(messages) + [{"role": "assistant", "content": answer}]
            keys.append(self._digest(caller, history))
        if response_id is not None:
            keys.append(self._response_digest(caller, response_id))
        for key in keys:
            entry = self._answered.get(key)
            if entry is None:
                self._answered[key] = _Answered([session_id], state)
            elif session_id not in entry.sessions:
                entry.sessions.append(session_id)
            self._answered.move_to_end(key)
        self._latest[session_id] = tuple(keys)
        self._latest.move_to_end(session_id)
        while len(self._answered) > self.max_entries:
            self._answered.popitem(last=False)
        while len(self._latest) > self.max_entries:
            self._latest.popitem(last=False)

    def moved_on(self, session_id: str) -> None:
        """`session_id` answered again without anything to remember (a named turn): no
        earlier answer of it is its latest any more, so continuing one forks."""
        self._latest.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._answered)

    def _digest(self, caller: str, messages: List[Dict[str, Any]]) -> str:
        text = json.dumps([caller] + [[m.get("role"), content_text(m.get("content"))]
                                       for m in messages], separators=(",", ":"))
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    def _session_id(self, caller: str, kind: str, name: str) -> str:
        digest = hmac.new(self._secret, json.dumps([caller, kind, name]).encode(),
                          hashlib.sha256).hexdigest()
        return f"openai-{digest[:24]}"

    def _response_digest(self, caller: str, response_id: str) -> str:
        text = json.dumps([caller, "response", response_id])
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()


def client_name(headers: Mapping[str, str], user: Any) -> Optional[str]:
    """The conversation's name as the client gives it, or None."""
    for header in NAME_HEADERS:
        value = (headers.get(header) or "").strip()
        if value:
            return f"{header}:{value[:MAX_NAME]}"
    if isinstance(user, str) and user.strip():
        return f"user:{user.strip()[:MAX_NAME]}"
    return None


TEXT_PARTS = ("text", "input_text", "output_text")     # chat completions', the Responses API's


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and part.get("type") in TEXT_PARTS
                       and isinstance(part.get("text"), str))
    return ""


def new_session_id() -> str:
    return f"openai-{uuid.uuid4().hex[:24]}"
