"""Reading what the hub sends back: one untrusted bus payload in, one `Reply` (or `None`) out.

Everything that arrives over the wire passes through `parse_reply` before any other code looks at
it, so a malformed or hostile payload is rejected here, in one place, and never reaches a turn.
"""
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Optional, Tuple

from hivemind_chat_agent.core.protocol_names import (
    ANSWER_TAKEN_SUFFIX,
    CANCELLED_TYPES,
    HANDLED_TYPES,
    QUESTION_LISTENING_SUFFIX,
    QUESTION_OPEN_TYPE,
    SPEAK_TYPES,
    STOP_RESPONSE_SUFFIX,
    TURN_TAG_KEY,
    UNMATCHED_TYPES,
)

MAX_UTTERANCE_CHARS = 100_000   # a longer "sentence" is not speech; drop it
MAX_SESSION_KEYS = 200          # a serialized Session has ~20; far more means garbage


class ReplyKind(str, Enum):
    SPEAK = "speak"
    HANDLED = "handled"
    UNMATCHED = "unmatched"
    CANCELLED = "cancelled"
    QUESTION_OPEN = "question_open"   # a skill's get_response() starts listening for an answer
    ANSWER_TAKEN = "answer_taken"     # ovos-core gave this utterance to a waiting get_response()
    QUESTION_LISTENING = "question_listening"   # the asking skill is ready to take the answer
    STOPPED = "stopped"               # a skill (or engine) stopped at our stop: it says no more
    OTHER = "other"             # any other message of the session: only refreshes its Session


@dataclass(frozen=True)
class Reply:
    kind: ReplyKind
    msg_type: str
    session_id: str
    session: Optional[Mapping[str, Any]]   # serialized Session, validated to be a dict
    turn_tag: Optional[str]                 # our tag echoed back in context, if the hub kept it
    utterance: str = ""
    expect_response: bool = False           # a skill asked a question and waits for the answer
    skill_id: str = ""                      # the asking skill: QUESTION_*, ANSWER_TAKEN
    reason: str = ""                        # UNMATCHED: why, when the hub says (busy, ...)
    detail: str = ""                        # UNMATCHED: the hub's words for it
    speaker: str = ""                       # SPEAK: what spoke it (data.meta.skill)
    # HANDLED: the hub keeps a record of each turn id and answers a repeated id from it (our
    # plugin says so in data.turn_records); only then may a lost turn be sent again
    turn_records: bool = False


def parse_reply(msg_type: Any, data: Any, context: Any) -> Tuple[Optional[Reply], str]:
    """Return (reply, "") for a usable payload, or (None, why) for one to ignore."""
    if not isinstance(msg_type, str) or not msg_type:
        return None, "no message type"
    if not isinstance(context, Mapping):
        return None, f"{msg_type}: context is not a dict"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        return None, f"{msg_type}: data is not a dict"
    session = context.get("session")
    if not isinstance(session, Mapping):
        return None, f"{msg_type}: no session in context"
    session_id = session.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        return None, f"{msg_type}: session has no id"
    if len(session) > MAX_SESSION_KEYS:
        return None, f"{msg_type}: oversized session"
    tag = context.get(TURN_TAG_KEY)
    if tag is not None and not isinstance(tag, str):
        return None, f"{msg_type}: malformed turn tag"

    if msg_type in SPEAK_TYPES:
        utterance = data.get("utterance")
        if not isinstance(utterance, str):
            return None, f"{msg_type}: utterance is not a string"
        if len(utterance) > MAX_UTTERANCE_CHARS:
            return None, f"{msg_type}: utterance of {len(utterance)} chars is too long"
        meta = data.get("meta")
        speaker = meta.get("skill") if isinstance(meta, Mapping) else None
        return Reply(ReplyKind.SPEAK, msg_type, session_id, session, tag, utterance,
                     data.get("expect_response") is True,
                     speaker=speaker[:100] if isinstance(speaker, str) else ""), ""
    if msg_type in HANDLED_TYPES:
        return Reply(ReplyKind.HANDLED, msg_type, session_id, session, tag,
                     turn_records=data.get("turn_records") is True), ""
    elif msg_type in UNMATCHED_TYPES:
        reason, detail = data.get("reason"), data.get("message")
        return Reply(ReplyKind.UNMATCHED, msg_type, session_id, session, tag,
                     reason=reason[:40] if isinstance(reason, str) else "",
                     detail=detail[:300] if isinstance(detail, str) else ""), ""
    elif msg_type in CANCELLED_TYPES:
        kind = ReplyKind.CANCELLED
    elif msg_type == QUESTION_OPEN_TYPE:
        skill_id = data.get("skill_id")
        return Reply(ReplyKind.QUESTION_OPEN, msg_type, session_id, session, tag,
                     skill_id=skill_id if isinstance(skill_id, str) else ""), ""
    elif skill_id := _skill_named(msg_type, ANSWER_TAKEN_SUFFIX):
        return Reply(ReplyKind.ANSWER_TAKEN, msg_type, session_id, session, tag,
                     skill_id=skill_id), ""
    elif skill_id := _skill_named(msg_type, QUESTION_LISTENING_SUFFIX):
        return Reply(ReplyKind.QUESTION_LISTENING, msg_type, session_id, session, tag,
                     skill_id=skill_id), ""
    elif msg_type.endswith(STOP_RESPONSE_SUFFIX) and data.get("result") is True:
        skill_id = data.get("skill_id")
        return Reply(ReplyKind.STOPPED, msg_type, session_id, session, tag,
                     skill_id=skill_id if isinstance(skill_id, str) else ""), ""
    else:
        kind = ReplyKind.OTHER
    return Reply(kind, msg_type, session_id, session, tag), ""


def _skill_named(msg_type: str, suffix: str) -> str:
    """The skill id of a "<skill_id><suffix>" message type; "" when it is not one, or names no
    skill."""
    return msg_type[:-len(suffix)] if msg_type.endswith(suffix) else ""


def first_utterance(data: Any) -> Optional[str]:
    """The text of an utterance message's data (`utterances[0]`, or `utterance`), if any."""
    if not isinstance(data, dict):
        return None
    utterances = data.get("utterances")
    if isinstance(utterances, list) and utterances and isinstance(utterances[0], str):
        return utterances[0]
    utterance = data.get("utterance")
    return utterance if isinstance(utterance, str) else None
