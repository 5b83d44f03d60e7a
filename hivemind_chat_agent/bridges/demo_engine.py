"""An offline chatbot ChatEngine for `hivemind-chat demo`: the ALICE AIML set of the `aiml`
package, with one AIML session per session_id, so "my name is Ada" ... "what is my name" works
within a conversation and not across conversations. A session this engine has not seen starts
from the conversation's earlier user messages (the hub's history), so a conversation that moves
to another hub (replicas sharing a Redis store) keeps what the user told it.

Learning the 63 ALICE files takes seconds; the learned brain is kept in the user's cache
(aiml_brain.py) and read back on every later start (docs/performance.md, the demo's start)."""
import glob
import os
import sys
import threading
import time
from typing import Iterable, List, Optional

from ovos_plugin_manager.templates.agents import AgentMessage, ChatEngine, MessageRole
from ovos_utils.log import LOG

from hivemind_chat_agent.bridges import aiml_brain

MEMORY_AIML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "memory.aiml")


class _TimeWithClock:
    """aiml 0.9.2 calls time.clock(), removed in Python 3.8; give only aiml a stand-in instead
    of patching the standard library for everyone."""
    clock = staticmethod(time.perf_counter)

    def __getattr__(self, name):
        return getattr(time, name)


def aiml_sources() -> List[str]:
    """The AIML files the demo's brain is learned from, in learning order: the ALICE set that
    the `aiml` package ships, then ours ("what is my name" answered from the predicate)."""
    import aiml
    alice = os.path.join(os.path.dirname(aiml.__file__), "botdata", "alice")
    return sorted(glob.glob(os.path.join(alice, "*.aiml"))) + [MEMORY_AIML]


def new_kernel():
    """An empty aiml Kernel, quiet, its time.clock() call made to work on Python >= 3.8: the
    kernel that `learn` or a cached brain (aiml_brain.install) then fills. Its `version()`
    is part of the brain cache's key."""
    import aiml
    sys.modules["aiml.Kernel"].time = _TimeWithClock()   # the module, not the class
    kernel = aiml.Kernel()
    kernel.verbose(False)
    return kernel


def learn(kernel, sources: List[str]):
    """`kernel`, having learned the AIML files `sources` in their order (a later file's
    category replaces an earlier one's of the same pattern). Slow for the ALICE set (seconds):
    `learned_kernel` avoids it when a cached brain fits."""
    for path in sources:
        kernel.learn(path)
    return kernel


def learned_kernel(sources: List[str], cache_dir: Optional[str]):
    """A kernel holding the brain of `sources`: read from `cache_dir` when a sound copy for
    exactly these files, this aiml and this Python is there, learned (and written there for
    the next start) otherwise. A missing, corrupt or unwritable cache costs time, never the
    demo: it is learned again."""
    kernel = new_kernel()
    if cache_dir is None or not aiml_brain.fits(kernel):
        return learn(kernel, sources)
    key = aiml_brain.brain_key(sources, kernel.version())
    path = aiml_brain.brain_path(cache_dir, key)
    brain = aiml_brain.read(path, key)
    if brain is not None:
        aiml_brain.install(kernel, brain)
        return kernel
    learn(kernel, sources)
    try:
        aiml_brain.write(path, key, aiml_brain.take(kernel))
    except OSError as e:
        LOG.warning(f"the demo's AIML brain was not cached in {cache_dir} "
                    f"({type(e).__name__}: {e}); the next start learns it again")
    return kernel


def _load_kernel(bot_name: str, cache_dir: Optional[str] = None):
    kernel = learned_kernel(aiml_sources(), cache_dir)
    kernel.setBotPredicate("name", bot_name)
    kernel.setBotPredicate("master", "the HiveMind community")
    return kernel


class AIMLChatEngine(ChatEngine):
    """opm.agents.chat plugin `hivemind-chat-demo-aiml`. Config: `bot_name`; `brain_cache`,
    the folder its learned brain is kept in (default: hivemind-chat-agent in the user's
    XDG cache folder; `false` learns it on every start)."""

    def __init__(self, config=None):
        super().__init__(config)
        cache = self.config.get("brain_cache", True)
        cache_dir = aiml_brain.default_cache_dir() if cache is True else (cache or None)
        self._kernel = _load_kernel(self.config.get("bot_name", "HiveMind"), cache_dir)
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
                for earlier in said[:-1]:   # what it was told on another hub, or before a restart
                    self._kernel.respond(earlier, session_id)
            answer = self._kernel.respond(text, session_id) if text.strip() else ""
        return AgentMessage(MessageRole.ASSISTANT, answer.strip())

    def stream_sentences(self, messages, session_id: str = "default",
                         lang: Optional[str] = None, units: Optional[str] = None) -> Iterable[str]:
        content = self.continue_chat(messages, session_id, lang, units).content
        if content:
            yield content
