"""Which OVOS conversation an OpenAI chat request continues, with no I/O.

OpenAI clients send the whole history with every request and usually no conversation id, while
the hub keeps a conversation in its OVOS Session: a request must be mapped to one session id.
In order of precedence:

1. a name the client gives: the `X-OpenWebUI-Chat-Id` header (Open WebUI with its user-info
   headers on), `X-Conversation-Id` (LibreChat's custom headers, scripts), the body's `user`.
   A named conversation continues from its name alone, whatever history the request carries.
2. the history itself: for every answer given, `ConversationIndex` remembers a digest of the
   conversation up to and including that answer. A request whose earlier messages have one of
   those digests continues that session. Two chats that began alike (same question, same
   answer) share a digest; a request matching both continues in a session of its own, started
   from their common state (the Session as it was after that answer), never inside either.
3. anything else starts a new session.

Sessions are per API key (one key never reaches another's conversations), digests are keyed
hashes of the messages, and the index is bounded (least recently used forgotten first).
"""
import hashlib
import hmac
import json
import secrets
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

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

    def continuation(self, api_key: str, headers: Mapping[str, str], user: Any,
                     messages: List[Dict[str, Any]]) -> Continuation:
        """Where the request with these `headers` (lower-case names), body `user` and
        `messages` (the last one: the new utterance) continues."""
        name = client_name(headers, user)
        if name is not None:
            return Continuation(self._session_id(api_key, "name", name), named=True)
        earlier = messages[:-1]
        if earlier:
            digest = self._digest(api_key, earlier)
            entry = self._answered.get(digest)
            if entry is not None:
                self._answered.move_to_end(digest)
                if len(set(entry.sessions)) == 1:
                    return Continuation(entry.sessions[0])
                return Continuation(new_session_id(), start_from=entry.state)
        return Continuation(new_session_id())

    def answered(self, api_key: str, session_id: str, messages: List[Dict[str, Any]],
                 answer: str, state: Optional[Dict[str, Any]] = None) -> None:
        """`session_id` answered `messages` with `answer`; `state`: its Session after it."""
        history = list(messages) + [{"role": "assistant", "content": answer}]
        key = self._digest(api_key, history)
        entry = self._answered.get(key)
        if entry is None:
            self._answered[key] = _Answered([session_id], state)
        elif session_id not in entry.sessions:
            entry.sessions.append(session_id)
        self._answered.move_to_end(key)
        while len(self._answered) > self.max_entries:
            self._answered.popitem(last=False)

    def __len__(self) -> int:
        return len(self._answered)

    def _digest(self, api_key: str, messages: List[Dict[str, Any]]) -> str:
        text = json.dumps([api_key] + [[m.get("role"), content_text(m.get("content"))]
                                       for m in messages], separators=(",", ":"))
        return hmac.new(self._secret, text.encode(), hashlib.sha256).hexdigest()

    def _session_id(self, api_key: str, kind: str, name: str) -> str:
        digest = hmac.new(self._secret, json.dumps([api_key, kind, name]).encode(),
                          hashlib.sha256).hexdigest()
        return f"openai-{digest[:24]}"


def client_name(headers: Mapping[str, str], user: Any) -> Optional[str]:
    """The conversation's name as the client gives it, or None."""
    for header in NAME_HEADERS:
        value = (headers.get(header) or "").strip()
        if value:
            return f"{header}:{value[:MAX_NAME]}"
    if isinstance(user, str) and user.strip():
        return f"user:{user.strip()[:MAX_NAME]}"
    return None


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and part.get("type") == "text"
                       and isinstance(part.get("text"), str))
    return ""


def new_session_id() -> str:
    return f"openai-{uuid.uuid4().hex[:24]}"
