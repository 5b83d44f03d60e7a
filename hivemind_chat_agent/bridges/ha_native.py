"""What the native Home Assistant integration (custom_components/hivemind_chat) decides, in
plain functions that need no Home Assistant: the agent's config from a config entry, the form
error a failed connection shows, the OVOS session of an HA conversation, the deltas a turn
streams into HA's chat log, and what a turn that ended means to HA (speech, error code,
`continue_conversation`). The integration itself is only the glue around these.

Every spoken failure names the hub (host:port) and never quotes the agent's own message,
which may carry addresses, paths or headers; that goes to HA's log.
"""
import asyncio
import hashlib
import os
from dataclasses import dataclass, field
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Tuple,
)

from hivemind_chat_agent.core.outcomes import TurnStatus
from hivemind_chat_agent.errors import (
    AuthenticationError,
    ConfigurationError,
    ConnectionLostError,
    HandshakeTimeoutError,
    HiveMindChatError,
    HubCertificateChangedError,
    HubKeyChangedError,
    HubUnreachableError,
    PolicyDeniedError,
    TurnTimeoutError,
    UnsupportedHubError,
)

DOMAIN = "hivemind_chat"
CONF_HOST, CONF_PORT, CONF_KEY, CONF_PASSWORD = "host", "port", "access_key", "password"
CONF_LANGUAGE, CONF_PER_DEVICE, CONF_TIMEOUT = "language", "per_device", "timeout"
CONF_HOME_CONTROL = "home_control"
DEFAULT_PORT, DEFAULT_TIMEOUT = 5678, 30.0
SEPARATOR = "\n"    # between sentences in the chat log (HA's own between several answers)
# HA's IntentResponseErrorCode values (homeassistant/helpers/intent.py)
NO_INTENT_MATCH, FAILED_TO_HANDLE, UNKNOWN = "no_intent_match", "failed_to_handle", "unknown"


def agent_config(data: Mapping[str, Any], options: Mapping[str, Any],
                 storage_dir: str) -> Dict[str, Any]:
    """HiveMindChatAgent's config for a config entry's `data` (host, port, access key,
    password) and `options` (timeout). The Noise pins and the session store live in
    `storage_dir` (under HA's .storage), so a changed hub key is noticed and conversations
    are kept across HA restarts."""
    return {"host": str(data[CONF_HOST]), "port": int(data.get(CONF_PORT) or DEFAULT_PORT),
            "key": str(data[CONF_KEY]), "password": str(data[CONF_PASSWORD]),
            "timeout": float(options.get(CONF_TIMEOUT) or DEFAULT_TIMEOUT),
            "connect_timeout": 10.0,
            "useragent": "home-assistant-hivemind-chat",
            "noise_key_dir": os.path.join(storage_dir, "noise"),
            "session_store": os.path.join(storage_dir, "sessions")}


def hub_name(data: Mapping[str, Any]) -> str:
    """host:port of a config entry's hub, as every message names it."""
    return f"{data[CONF_HOST]}:{int(data.get(CONF_PORT) or DEFAULT_PORT)}"


def flow_error(e: BaseException) -> str:
    """The config flow's form error (strings.json `config.error`) for what connecting raised:
    `hub_key_changed` (the hub's Noise key or TLS certificate is not the pinned one),
    `invalid_auth` (the access key or password refused), `cannot_connect` (nothing answered,
    no handshake, a protocol we lack), `invalid_config`, else `unknown`."""
    if isinstance(e, (HubKeyChangedError, HubCertificateChangedError)):
        return "hub_key_changed"
    if isinstance(e, AuthenticationError):
        return "invalid_auth"
    if isinstance(e, (HubUnreachableError, HandshakeTimeoutError, ConnectionLostError,
                      UnsupportedHubError, OSError)):
        return "cannot_connect"
    if isinstance(e, ConfigurationError):
        return "invalid_config"
    return "unknown"


def needs_reauth(e: Optional[BaseException]) -> bool:
    """The hub refused the entry's access key or password: HA should ask for new ones
    (a reauth flow). A changed hub key is no such case: new credentials would not help."""
    return e is not None and flow_error(e) == "invalid_auth"


def context_id(value: Any, limit: int = 64) -> str:
    """An HA id (conversation, device, satellite) as a session id part: at most `limit`
    characters; a longer one is cut and ends with a digest of the whole, so two never merge."""
    text = "" if value is None else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 17]}~{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def session_for(entry_id: str, conversation_id: Optional[str], device_id: Optional[str],
                satellite_id: Optional[str], per_device: bool) -> Tuple[str, str]:
    """(OVOS session id, site id) of one HA turn. Each HA conversation_id is one session;
    `per_device`: one session per satellite (or device), whatever the conversation, so a
    kitchen speaker keeps its context between wake words. Namespaced by the config entry, so
    two entries never share one. A turn with neither id gets the entry's own session."""
    device = context_id(satellite_id) or context_id(device_id)
    site = device or "home-assistant"
    namespace = hashlib.sha256(entry_id.encode()).hexdigest()[:8]
    if per_device and device:
        return f"ha-{namespace}-dev-{device}", site
    conversation = context_id(conversation_id)
    return f"ha-{namespace}-{conversation or 'default'}", site


@dataclass
class TurnReport:
    """What streaming a turn found: its sentences, whether the hub asked a question, and the
    typed error that ended it (None when it ended well)."""
    sentences: List[str] = field(default_factory=list)
    asked: bool = False
    error: Optional[HiveMindChatError] = None
    status: Optional[TurnStatus] = None


async def sentence_deltas(turn: Any, report: TurnReport) -> AsyncIterator[Dict[str, str]]:
    """HA chat-log deltas (AssistantContentDeltaDict) of `turn`, one per sentence as the hub
    speaks it: the first starts the assistant message ({"role", "content"}), the next ones
    add to it ({"content": SEPARATOR + sentence}). A typed error ends the stream quietly
    (into `report.error`), so what was said stays in the log; nothing spoken, nothing yielded."""
    try:
        async for sentence in turn:
            if report.sentences:
                yield {"content": SEPARATOR + sentence}
            else:
                yield {"role": "assistant", "content": sentence}
            report.sentences.append(sentence)
    except HiveMindChatError as e:
        report.error = e
    report.status = turn.status
    report.asked = bool(turn.expect_response)


Deltas = AsyncIterator[Dict[str, str]]


async def drain(deltas: Deltas) -> None:
    """A `consume` for run_turn that only reads the deltas (the ask action)."""
    async for _delta in deltas:
        pass


async def run_turn(agent: Any, text: str, *, session_id: str, lang: Optional[str],
                   site_id: Optional[str],
                   consume: Callable[[Deltas], Awaitable[Any]] = drain) -> TurnReport:
    """One turn of `agent` (a HiveMindChatAgent) through its asyncio API; `consume` reads its
    deltas (sentence_deltas: the entity streams them into HA's chat log). Never raises the
    agent's typed errors: they end up in the report. A turn still running when it returns,
    or cancelled by the caller (HA gave up), is terminated at the hub, off the event loop."""
    report = TurnReport()
    turn = None
    try:
        turn = await agent.abegin([{"role": "user", "content": text}], session_id=session_id,
                                  lang=lang, site_id=site_id)
        await consume(sentence_deltas(turn, report))
    except HiveMindChatError as e:
        report.error = e
    except asyncio.CancelledError:
        if turn is not None:
            asyncio.get_running_loop().run_in_executor(None, turn.terminate)
        raise
    if turn is not None and turn.is_running():
        await asyncio.get_running_loop().run_in_executor(None, turn.terminate)
    return report


@dataclass(frozen=True)
class Answer:
    """A turn's end as HA takes it: `speech` to say, `error_code` (an IntentResponseErrorCode
    value) when it is an error response, `continue_conversation` (reopen the microphone)."""
    speech: str
    error_code: Optional[str] = None
    continue_conversation: bool = False


def answer_for(report: TurnReport, hub: str) -> Answer:
    """The answer to give HA. Sentences spoken: their text, continuing exactly when the hub
    asked (TurnStatus.ASKED), whatever ended the turn after them. None: an error response
    whose speech names `hub` and what went wrong."""
    if report.sentences:
        return Answer(SEPARATOR.join(report.sentences),
                      continue_conversation=report.asked and report.error is None)
    if report.error is not None:
        return failure_answer(report.error, hub)
    if report.status is TurnStatus.TIMED_OUT:
        return Answer(f"Sorry, the OVOS hub at {hub} took too long to answer.", UNKNOWN)
    return Answer("Sorry, I didn't understand that.", NO_INTENT_MATCH)


def failure_answer(e: HiveMindChatError, hub: str) -> Answer:
    """The error response for a turn the hub did not answer (never quoting `e`'s message)."""
    if isinstance(e, TurnTimeoutError):
        return Answer(f"Sorry, the OVOS hub at {hub} took too long to answer.", UNKNOWN)
    if isinstance(e, PolicyDeniedError):
        return Answer(f"Sorry, the OVOS hub at {hub} refused this request.", FAILED_TO_HANDLE)
    if isinstance(e, (HubKeyChangedError, HubCertificateChangedError)):
        return Answer(f"Sorry, the OVOS hub at {hub} is not the one this assistant was set up "
                      "with: its key changed.", UNKNOWN)
    if isinstance(e, AuthenticationError):
        return Answer(f"Sorry, the OVOS hub at {hub} refused this assistant's credentials.",
                      UNKNOWN)
    if isinstance(e, (HubUnreachableError, ConnectionLostError, HandshakeTimeoutError)):
        return Answer(f"Sorry, I can't reach the OVOS hub at {hub} right now.", UNKNOWN)
    return Answer(f"Sorry, something went wrong on the OVOS hub at {hub}.", FAILED_TO_HANDLE)


__all__ = ["DOMAIN", "agent_config", "hub_name", "flow_error", "needs_reauth", "session_for",
           "TurnReport", "sentence_deltas", "run_turn", "drain", "Answer", "answer_for",
           "failure_answer"]
