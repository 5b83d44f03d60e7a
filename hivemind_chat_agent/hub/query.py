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
from hivemind_chat_agent.core.transcript import ANSWERED, STOPPED
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.hub.serial_executor import QueueFull

if TYPE_CHECKING:
    from hivemind_chat_agent.hub.protocol import ChatAgentProtocol

_END = object()


def stream_answer(protocol: "ChatAgentProtocol", utterance: str, lang: str,
                  group: str, history: Optional[str] = None) -> Iterator[Optional[str]]:
    """Sentences of the engine's answer, then exactly one None. With `history` (an engine
    session id), the engine gets that session's transcript first, and the exchange is kept
    in it."""
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
            messages = protocol.conversation(history, utterance) if history else \
                [AgentMessage(role=MessageRole.USER, content=utterance)]
            for sentence in protocol.engine.stream_sentences(
                    messages, session_id=session_id, lang=sess.lang, units=sess.system_unit):
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
    said, ended = [], None
    try:
        while True:
            try:
                item = sentences.get(timeout=timeout)
            except queue.Empty:
                LOG.warning(f"QUERY answer ended early: the engine gave no sentence for "
                            f"{timeout:g} s")
                protocol.executor.cancel(session_id, run)   # if it never started
                ended = EndReason.TIMEOUT.value
                break
            if item is _END:
                ended = ANSWERED if said else EndReason.NOT_UNDERSTOOD.value
                break
            if isinstance(item, Exception):
                LOG.warning(f"QUERY answer ended early: engine raised "
                            f"{type(item).__name__}: {item}")
                ended = EndReason.ENGINE_ERROR.value
                break
            said.append(item)
            yield item
    finally:
        abandoned.set()
        if history:     # a consumer that stopped listening heard what it was given
            protocol.record(history, utterance, said, ended or (
                STOPPED if said else EndReason.NOT_UNDERSTOOD.value))
    yield None
