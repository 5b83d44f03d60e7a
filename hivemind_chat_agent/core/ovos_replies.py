"""What the OVOS mode's routes send back to a satellite besides OVOS's own frames, and which of
OVOS's frames a satellite must not hear twice, without I/O (core/ovos_routes.py decides who
gets what; this says what the frames are).

- `failure_replies`: an utterance refused or lost gets the chat mode's failure shape.
- `is_twin`: ovos-bus-client 2.x (ovos-core 3.x) sends each renamed topic twice; the second
  spelling of a frame already routed for a session is dropped.
"""
import json
from typing import Any, Deque, Dict, List

from hivemind_chat_agent.core.ovos_route_terms import Outbound, Refusal
from hivemind_chat_agent.core.protocol_names import HANDLED_TYPE, UNMATCHED_TYPE

TWIN_MARKERS = ("_namespace_compat_twin", "_intent_compat_twin")   # ovos-bus-client 2.x


def is_twin(message: Dict[str, Any], context: Dict[str, Any], recent_frames: Deque[str]) -> bool:
    """A second spelling of a frame routed for this session? ovos-bus-client 2.x
    (ovos-core 3.x) sends each renamed topic twice, `ovos.utterance.speak` then `speak`
    marked as its twin; the stock plugin's bus client drops a marked twin whose first frame it
    saw, so a satellite hears each sentence once. With several utterances of one session in
    flight, other frames come between a first frame and its twin (one sentence in 3000 was
    heard twice when only the last frame was remembered): the session keeps its last first
    frames in `recent_frames` (a bounded deque), and each twin drops the one it matches. A
    marked frame with no such first frame (a reply that copied the marker) is delivered."""
    fingerprint = json.dumps(message.get("data"), sort_keys=True, default=str)
    if any(context.get(marker) for marker in TWIN_MARKERS):
        if fingerprint in recent_frames:
            recent_frames.remove(fingerprint)
            return True
        return False
    recent_frames.append(fingerprint)
    return False


def failure_replies(outbound: Outbound, refusal: Refusal) -> List[Dict[str, Any]]:
    """What the satellite hears for an utterance that was refused or could not reach OVOS:
    the chat mode's failure shape (hub/hub_turn.HubTurn.finish), its context the utterance's
    (so a turn tag comes back), its Session under the id the satellite declared."""
    context = dict(outbound.message.get("context") or {})
    context["source"], context["destination"] = "hivemind-chat-agent-plugin", \
        outbound.sender.peer
    context["session"] = dict(context.get("session") or {},
                              session_id=outbound.sender.declared_session)
    return [{"type": UNMATCHED_TYPE, "data": {"reason": refusal.reason.value,
                                             "message": refusal.why}, "context": context},
            {"type": HANDLED_TYPE, "data": {}, "context": dict(context)}]
