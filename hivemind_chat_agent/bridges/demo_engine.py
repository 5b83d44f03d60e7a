"""An offline chatbot ChatEngine for `hivemind-chat demo`: the ALICE AIML set of the `aiml`
package, with one AIML session per session_id, so "my name is Ada" ... "what is my name" works
within a conversation and not across conversations. A session this engine has not seen starts
from the conversation's earlier user messages (the hub's history), so a conversation that moves
to another hub (replicas sharing a Redis store) keeps what the user told it."""
import glob
import os
import sys
import threading
import time
from typing import Iterable, Optional

from ovos_plugin_manager.templates.agents import AgentMessage, ChatEngine, MessageRole

MEMORY_AIML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "memory.aiml")


class _TimeWithClock:
    """aiml 0.9.2 calls time.clock(), removed in Python 3.8; give only aiml a stand-in instead
    of patching the standard library for everyone."""
    clock = staticmethod(time.perf_counter)

    def __getattr__(self, name):
        return getattr(time, name)


def _load_kernel(bot_name: str):
    import aiml
    sys.modules["aiml.Kernel"].time = _TimeWithClock()   # the module, not the class
    kernel = aiml.Kernel()
    kernel.verbose(False)
    alice = os.path.join(os.path.dirname(aiml.__file__), "botdata", "alice")
    for path in sorted(glob.glob(os.path.join(alice, "*.aiml"))):
        kernel.learn(path)
    kernel.learn(MEMORY_AIML)    # "what is my name" answered from the session's predicate
    kernel.setBotPredicate("name", bot_name)
    kernel.setBotPredicate("master", "the HiveMind community")
    return kernel


class AIMLChatEngine(ChatEngine):
    """opm.agents.chat plugin `hivemind-chat-demo-aiml`. Config: `bot_name`."""

    def __init__(self, config=None):
        super().__init__(config)
        self._kernel = _load_kernel(self.config.get("bot_name", "HiveMind"))
        self._lock = threading.Lock()
        self._sessions = set()

    def continue_chat(self, messages, session_id: str = "default", lang: Optional[str] = None,
                      units: Optional[str] = None, tools=None) -> AgentMessage:
        said = [m.content for m in messages if getattr(m, "role", None) == MessageRole.USER
                and isinstance(m.content, str)]
        text = said[-1] if said else ""
        with self._lock:
            if session_id not in self._sessions:
                self._sessions.add(session_id)
                self._kernel.setPredicate("name", "Friend", session_id)
                for earlier in said[:-1]:      # what it was told on another hub, or before a restart
                    self._kernel.respond(earlier, session_id)
            answer = self._kernel.respond(text, session_id) if text.strip() else ""
        return AgentMessage(MessageRole.ASSISTANT, answer.strip())

    def stream_sentences(self, messages, session_id: str = "default",
                         lang: Optional[str] = None, units: Optional[str] = None) -> Iterable[str]:
        content = self.continue_chat(messages, session_id, lang, units).content
        if content:
            yield content
