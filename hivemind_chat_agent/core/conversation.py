"""Which fields of a serialized OVOS Session are the conversation, and which are the hub's.

Both sides use these: the client sends back the conversation a hub's reply carried (and the
hub's policy fields only where its caller set them), and the hub keeps the conversation of a
satellite session between turns for satellites that never echo it.
"""
from typing import Any, Dict, Optional

# What skills change between turns and the next turn must carry back. ovos-bus-client 2.x
# names: active_handlers, response_mode, and intent_context (the canonical form of context,
# which it reads first: an empty one must not hide the kept one).
CONVERSATION_FIELDS = ("active_skills", "utterance_states", "context", "active_handlers",
                       "response_mode", "intent_context")

# The hub's policy and live state: sent only where the caller set them. A Session built on the
# client fills these from the client machine's defaults (its pipeline names matchers the hub
# may not have; its blacklist is the client's), and ovos-core would obey them.
HUB_FIELDS = ("pipeline", "blacklisted_skills", "blacklisted_intents", "is_speaking",
              "is_recording")


def conversation_for_turn(declared: Dict[str, Any], session_id: str,
                          kept: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The serialized Session a satellite's turn runs with on the hub: what the satellite
    declares (language, location, units, site id; the hub's policy fields as hivemind-core
    injected them) under the engine's `session_id`, and the conversation fields of `kept` (the
    session's Session after its previous turn, serialized). A satellite that echoes the state
    back and one that never does get the same multi-turn behaviour."""
    data = {**declared, "session_id": session_id}
    for name in CONVERSATION_FIELDS:
        if kept is not None and name in kept:
            data[name] = kept[name]
    return data
