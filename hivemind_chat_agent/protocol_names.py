"""Message types of the OVOS conversation protocol, old and new names side by side.

Newer OVOS renames topics and may emit both names for the same event, so every consumer works
with these sets instead of single strings.
"""

UTTERANCE_TYPE = "recognizer_loop:utterance"          # what a satellite sends for one turn
UTTERANCE_TYPES = frozenset({UTTERANCE_TYPE, "ovos.utterance.handle"})

SPEAK_TYPE = "speak"
SPEAK_TYPES = frozenset({SPEAK_TYPE, "ovos.utterance.speak"})
HANDLED_TYPE = "ovos.utterance.handled"
HANDLED_TYPES = frozenset({HANDLED_TYPE})
UNMATCHED_TYPE = "complete_intent_failure"
UNMATCHED_TYPES = frozenset({UNMATCHED_TYPE, "ovos.intent.unmatched"})
CANCELLED_TYPES = frozenset({"ovos.utterance.cancelled"})

# Context key carrying a per-turn id. OVOS replies copy the request's context, so replies that
# come back with it can be matched to their turn exactly; replies without it fall back to
# matching by session.
TURN_TAG_KEY = "hivemind_chat_turn"
