"""Message types of the OVOS conversation protocol, old and new names side by side.

Newer OVOS renames topics and may emit both names for the same event, so every consumer works
with these sets instead of single strings.
"""

UTTERANCE_TYPE = "recognizer_loop:utterance"          # what a satellite sends for one turn
CURRENT_UTTERANCE_TYPE = "ovos.utterance.handle"      # its name in newer OVOS (5.x: "current")
UTTERANCE_TYPES = frozenset({UTTERANCE_TYPE, CURRENT_UTTERANCE_TYPE})

SPEAK_TYPE = "speak"
SPEAK_TYPES = frozenset({SPEAK_TYPE, "ovos.utterance.speak"})
HANDLED_TYPE = "ovos.utterance.handled"
HANDLED_TYPES = frozenset({HANDLED_TYPE})
UNMATCHED_TYPE = "complete_intent_failure"
UNMATCHED_TYPES = frozenset({UNMATCHED_TYPE, "ovos.intent.unmatched"})
CANCELLED_TYPES = frozenset({"ovos.utterance.cancelled"})

# A skill's get_response(): ovos-core announces the question (tagged with the asking utterance,
# data {"skill_id"}), then routes the user's next utterance to "<skill_id>.converse.get_response"
# (tagged with that answering utterance, which never gets an `ovos.utterance.handled`); the
# asking utterance's `handled` comes once the skill has finished with the answer.
QUESTION_OPEN_TYPE = "skill.converse.get_response.enable"
ANSWER_TAKEN_SUFFIX = ".converse.get_response"
# "<skill_id>.get_response.waiting" (tagged with the asking utterance): the skill's thread that
# takes the answer has started. ovos-workshop (7.x behind ovos-core 2.1.1, 9.x behind 3.7)
# starts that thread after the question is spoken and polls for its result 0.1 s later; an
# answer handed over before the thread has set itself up (a loaded hub, an answer sent at
# once) makes get_response() return None: the skill gives up though the answer was taken.
QUESTION_LISTENING_SUFFIX = ".get_response.waiting"

# What a satellite reports once it has played a `speak`; skills that speak with wait=True (and
# get_response, before it listens) block until it arrives for their session.
AUDIO_OUTPUT_END_TYPE = "recognizer_loop:audio_output_end"

# Barge-in: what OVOS emits to stop what is being said and done, carrying the session whose
# answer must stop. Every OVOS skill listens for it (a session-aware skill stops only that
# session's work) and answers "<skill_id>.stop.response"; ovos-core 3.x also knows it as
# "ovos.stop". HiveMind hubs of both generations let a client send it only once allowed.
STOP_TYPE = "mycroft.stop"
STOP_TYPES = frozenset({STOP_TYPE, "ovos.stop"})
STOP_RESPONSE_SUFFIX = ".stop.response"   # "<skill_id>.stop.response", {"result": stopped}

# What a 5.x hub answers to a message type the client was not allowed (or a quota refused).
POLICY_DENIED_TYPE = "hive.policy.denied"

# The name our hub plugin answers under (`meta.skill` of its speech, its stop answers).
CHAT_PLUGIN_NAME = "hivemind-chat-agent-plugin"

# Context key carrying a per-turn id. OVOS replies copy the request's context, so replies that
# come back with it can be matched to their turn exactly; replies without it fall back to
# matching by session.
TURN_TAG_KEY = "hivemind_chat_turn"
