"""The Wyoming bridge's state and its answer to one transcript (`hivemind-chat wyoming`).

Each transcript is one turn of `HiveMindChatAgent` through its asyncio API, so nothing blocks
the loop and many conversations run at once. What Home Assistant hears is always Handled or
NotHandled, before the agent's own timeout has passed: the sentences joined with "\\n" (HA's
own separator for several answers), or, when the hub understood nothing, failed, went silent
or is unreachable, a sentence a person can hear saying why. With `stream`, the answer follows
the Wyoming spec's streaming order (OHF-Voice/wyoming README, "Intent Handling"): HandledStart,
a HandledChunk per sentence as it arrives, the full Handled ("for backwards compatibility":
what Home Assistant's conversation client reads), then HandledStop. A turn that ends in a
skill's question says so in Handled's context (`{"continue_conversation": true}`, the name of
Home Assistant's own ConversationResult field), for clients that read it. The connection
around it (who may connect, deadlines, hang-ups) is bridges/wyoming_connection.py's.
"""
import hashlib
import logging
from typing import Any, Dict, List, Optional, Tuple

from hivemind_chat_agent.core.outcomes import TurnStatus
from hivemind_chat_agent.errors import (
    AuthenticationError,
    ConnectionLostError,
    HiveMindChatError,
    HubUnreachableError,
    PolicyDeniedError,
    TurnTimeoutError,
)

LOG = logging.getLogger(__name__)

# What a person hears when the hub gives no answer (English; the hub's own words when it has
# them come through as its sentences).
SPOKEN = {
    "not_understood": "Sorry, I didn't understand that.",
    "timed_out": "Sorry, the assistant took too long to answer.",
    "unreachable": "Sorry, I can't reach the assistant right now.",
    "refused": "Sorry, the assistant refused this request. Its log says why.",
    "failed": "Sorry, something went wrong on the assistant.",
    "busy": "Sorry, the assistant is busy with other requests. Try again in a moment.",
}
MAX_CONTEXT_ID = 64     # characters of a conversation or device id kept as they are
CONTINUE_CONVERSATION = "continue_conversation"   # Handled's context: the hub asked a question


def context_id(value: Any) -> str:
    """A conversation, device or satellite id of HA's context as this server uses it: a
    string or number, at most MAX_CONTEXT_ID characters (a longer one is cut and ends with a
    digest of the whole, so two long ids never merge); anything else (null, objects, lists of
    any depth) is no id."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return ""
    text = str(value)
    if len(text) <= MAX_CONTEXT_ID:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{text[:MAX_CONTEXT_ID - 17]}~{digest}"


def session_for(context: Dict[str, Any], peer: str, per_device: bool) -> Tuple[str, str]:
    """(OVOS session id, site id) for a transcript. HA's conversation_id is stable across its
    follow-up turns; it is namespaced by the asking HA (its address) and device, so two HA
    instances or devices never share a session. `per_device`: one session per satellite."""
    device = context_id(context.get("satellite_id")) or context_id(context.get("device_id"))
    conversation = context_id(context.get("conversation_id"))
    namespace = hashlib.sha256(f"{peer}\0{device}".encode("utf-8", "surrogatepass")
                               ).hexdigest()[:12]
    if per_device or not conversation:
        return f"ha-{namespace}", device or "home-assistant"
    return f"ha-{namespace}-{conversation}", device or "home-assistant"


class WyomingBridge:
    """The server's state: the agent and what it advertises."""

    def __init__(self, agent, languages: Optional[List[str]] = None, per_device: bool = False,
                 version: str = "", stream: bool = False, home_control: bool = True):
        self.agent = agent
        self.languages = languages or []
        self.per_device = per_device
        self.version = version
        # Home Assistant's conversation client (2026) reads Handled/NotHandled and skips the
        # streaming events; the full Handled the spec requires after the chunks is what it
        # takes. Streaming stays for clients the operator names (`--stream`), advertised then.
        self.stream = stream
        # Home Assistant 2026.6+ reads `supports_home_control`: without it the entity lacks
        # the CONTROL feature and HA tells users "this assistant cannot control your home".
        # An OVOS hub's skills usually can; `--no-home-control` for hubs that cannot.
        self.home_control = home_control

    def info_event(self):
        from wyoming.info import Attribution, HandleModel, HandleProgram, Info
        attribution = Attribution(name="OpenVoiceOS / HiveMind",
                                  url="https://github.com/JarbasHiveMind")
        model = HandleModel(name="ovos-hub", attribution=attribution, installed=True,
                            description="the skills of an OVOS hub, over HiveMind",
                            version=self.version, languages=list(self.languages))
        program = HandleProgram(name="hivemind-chat", attribution=attribution, installed=True,
                                description="An OVOS hub (its skills, follow-up questions "
                                            "and sessions) reached over HiveMind",
                                version=self.version, models=[model],
                                supports_handled_streaming=self.stream)
        event = Info(handle=[program]).event()
        # set in the event's data, not the dataclass: HandleProgram has the field from wyoming
        # 1.9.0 on, and every version's reader skips the keys it does not know
        for advertised in event.data["handle"]:
            advertised["supports_home_control"] = self.home_control
        return event

    async def warm_up(self, say=lambda text: None) -> None:
        """Connect at start, so that a wrong key or a dead hub is told now rather than at the
        first transcript, and a 4.x hub's spare connections are ready for new conversations."""
        try:
            await self.agent.awarm_up()
        except HiveMindChatError as e:
            say(f"the hub is not ready ({type(e).__name__}: {e}); until it is, each transcript "
                "is answered NotHandled saying so")
            return
        say("connected to the hub")

    async def answer(self, text: str, context: Dict[str, Any], language: Optional[str],
                     peer: str):
        """The events answering one transcript, ending with Handled, NotHandled or (when
        streaming) HandledStop; never raises. Streamed: HandledStart before the first
        sentence, a HandledChunk per sentence (they concatenate to the Handled text), the full
        Handled, HandledStop. Handled's context says whether the hub asked a question
        (CONTINUE_CONVERSATION). Closed or cancelled before the end (the caller hung up), it
        terminates the turn: the hub is told to stop, as Ctrl-C does in the CLI, and the
        turn's place at the hub is free at once."""
        from wyoming.handle import Handled, HandledChunk, HandledStart, HandledStop, NotHandled
        session_id, site_id = session_for(context, peer, self.per_device)
        sentences: List[str] = []
        failure = ""
        asked = False
        turn = None
        try:
            turn = await self.agent.abegin([{"role": "user", "content": text}],
                                           session_id=session_id, lang=language or None,
                                           site_id=site_id)
            async for sentence in turn:
                if self.stream:
                    if not sentences:
                        yield HandledStart().event()
                    yield HandledChunk(text=("\n" if sentences else "") + sentence).event()
                sentences.append(sentence)
            asked = bool(turn.expect_response)       # status ASKED: a skill's question
            if not sentences:
                failure = "not_understood" if turn.status is not TurnStatus.TIMED_OUT \
                    else "timed_out"
        except TurnTimeoutError:
            failure = "timed_out"
        except (HubUnreachableError, AuthenticationError, ConnectionLostError) as e:
            LOG.warning(f"the hub is out of reach: {e}")
            failure = "unreachable"
        except PolicyDeniedError as e:
            LOG.warning(f"the hub refused the transcript: {e}")
            failure = "refused"
        except HiveMindChatError as e:
            LOG.warning(f"a turn failed: {type(e).__name__}: {e}")
            failure = "failed"
        finally:
            if turn is not None and turn.is_running():    # given up: stop it at the hub
                turn.terminate()
        if not sentences:
            yield NotHandled(text=SPOKEN[failure or "not_understood"]).event()
            return
        # what was said stands, whatever ended the turn
        yield Handled(text="\n".join(sentences),
                      context={CONTINUE_CONVERSATION: asked}).event()
        if self.stream:
            yield HandledStop().event()


__all__ = ["WyomingBridge", "SPOKEN", "CONTINUE_CONVERSATION", "session_for"]
