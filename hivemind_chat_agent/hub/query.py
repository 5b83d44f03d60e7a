"""hivemind-core's QUERY (and CASCADE) answered by the plugin's engine.

Core calls `natural_language_query(utterance, lang)` (or `answer_query(..., client)`) on a
worker of its own and relays each yielded sentence as a `speak`, then ends the stream at the
first None. The engine runs as a turn does: on the plugin's bounded workers, under the rolling
timeout, in a Session of its own that is forgotten afterwards (a QUERY carries no session).
"""
import queue
import threading
import uuid
from typing import TYPE_CHECKING, Iterator, Optional

from ovos_bus_client.session import Session, SessionManager
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
from ovos_utils.log import LOG

from hivemind_chat_agent.compat import register_session as register
from hivemind_chat_agent.hub.serial_executor import QueueFull

if TYPE_CHECKING:
    from hivemind_chat_agent.hub.protocol import ChatAgentProtocol

_END = object()


def stream_answer(protocol: "ChatAgentProtocol", utterance: str, lang: str,
                  group: str) -> Iterator[Optional[str]]:
    """Sentences of the engine's answer, then exactly one None."""
    if not isinstance(utterance, str) or not utterance.strip():
        yield None
        return
    session_id = f"hivemind-query-{uuid.uuid4().hex}"
    sentences: "queue.Queue" = queue.Queue()
    abandoned = threading.Event()     # the consumer stopped listening

    def run() -> None:
        try:
            sess = register(Session.deserialize({"session_id": session_id,
                                                 "lang": lang or "en-US"}))
            for sentence in protocol.engine.stream_sentences(
                    [AgentMessage(role=MessageRole.USER, content=utterance)],
                    session_id=session_id, lang=sess.lang, units=sess.system_unit):
                if abandoned.is_set():
                    return
                if isinstance(sentence, str) and sentence.strip():
                    sentences.put(sentence)
            sentences.put(_END)
        except Exception as e:
            sentences.put(e)
        finally:
            SessionManager.sessions.pop(session_id, None)

    try:
        protocol.executor.submit(session_id, run, group=group)
    except QueueFull as e:
        LOG.warning(f"not answering a QUERY: hub busy ({e})")
        yield None
        return
    timeout = protocol.settings.timeout
    try:
        while True:
            try:
                item = sentences.get(timeout=timeout)
            except queue.Empty:
                LOG.warning(f"QUERY answer ended early: the engine gave no sentence for "
                            f"{timeout:g} s")
                protocol.executor.cancel(session_id, run)   # if it never started
                break
            if item is _END:
                break
            if isinstance(item, Exception):
                LOG.warning(f"QUERY answer ended early: engine raised "
                            f"{type(item).__name__}: {item}")
                break
            yield item
    finally:
        abandoned.set()
    yield None
