"""hivemind-core's QUERY (and CASCADE) answered by the plugin's engine.

Core calls `natural_language_query(utterance, lang)` (or `answer_query(..., client)`) on a
worker of its own and relays each yielded sentence as a `speak`, then ends the stream at the
first None. The engine runs as a turn does: on the plugin's bounded workers, under the rolling
timeout, in a Session of its own that is forgotten afterwards (a QUERY carries no session).
A client's QUERYs (`answer_query` names the client) are one conversation per access key,
followed and released as a satellite session is (hub/satellite_book.py).
"""
import threading
import uuid
from collections import deque
from typing import Any, Callable, Deque, Iterator, List, Optional, Protocol

from ovos_bus_client.session import Session, SessionManager
from ovos_plugin_manager.templates.agents import AgentMessage
from ovos_utils.log import LOG

from hivemind_chat_agent.compat import register_session as register
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.limits import shown
from hivemind_chat_agent.core.satellites import engine_session_id
from hivemind_chat_agent.core.transcript import ANSWERED, STOPPED
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub.connections import connection_client
from hivemind_chat_agent.hub.conversation_store import ConversationStore
from hivemind_chat_agent.hub.exchanges import EndedExchange
from hivemind_chat_agent.hub.hub_turn import agent_messages
from hivemind_chat_agent.hub.satellite_book import SatelliteBook
from hivemind_chat_agent.hub.serial_executor import KeyedSerialExecutor, QueueFull
from hivemind_chat_agent.hub.settings import HubSettings

QUERY_SESSION = "hivemind-query"   # the declared session id a client's QUERYs are kept under


class QueryHost(Protocol):
    """What a QUERY needs of the plugin (hub/protocol.ChatAgentProtocol)."""
    engine: Any
    executor: KeyedSerialExecutor
    settings: HubSettings
    clock: Clock
    store: ConversationStore
    satellites: SatelliteBook

    def keep_exchange(self, ended: EndedExchange) -> None:
        """Keep an ended exchange in its session's history (hub/exchanges.py)."""


_END = object()
_TIMED_OUT = object()


class _Answer:
    """The engine's sentences on their way from its worker to the QUERY's consumer; then
    `_END`, or the exception the engine raised."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self._items: Deque[Any] = deque()
        self._arrived = threading.Condition()
        self.abandoned = threading.Event()     # the consumer stopped listening

    def put(self, item: Any) -> None:
        with self._arrived:
            self._items.append(item)
            self._arrived.notify_all()

    def take(self, timeout: float) -> Any:
        """The next item, or `_TIMED_OUT` when none came for `timeout` seconds."""
        with self._arrived:
            if not self._items:
                self._clock.wait(self._arrived, timeout)
            return self._items.popleft() if self._items else _TIMED_OUT


def _engine_job(protocol: QueryHost, session_id: str, lang: str, messages: List[AgentMessage],
                answer: _Answer) -> Callable[[], None]:
    def run() -> None:
        try:
            sess = register(Session.deserialize({"session_id": session_id,
                                                 "lang": lang or "en-US"}))
            for sentence in protocol.engine.stream_sentences(
                    messages, session_id=session_id, lang=sess.lang, units=sess.system_unit):
                if answer.abandoned.is_set():
                    return
                if isinstance(sentence, str) and sentence.strip():
                    answer.put(sentence)
            answer.put(_END)
        except Exception as e:
            answer.put(e)
        finally:
            SessionManager.sessions.pop(session_id, None)
    return run


def stream_answer(protocol: QueryHost, utterance: str, lang: str,
                  group: str, history: Optional[str] = None) -> Iterator[Optional[str]]:
    """Sentences of the engine's answer, then exactly one None. With `history` (an engine
    session id), the engine gets that session's transcript first, and the exchange is kept
    in it. The answer ends when the engine gives no sentence for the hub's timeout (on the
    plugin's clock)."""
    if not isinstance(utterance, str) or not utterance.strip():
        yield None
        return
    session_id = f"hivemind-query-{uuid.uuid4().hex}"
    try:
        earlier = protocol.store.history(history) if history else []   # read once, kept with it
        messages = agent_messages(earlier, utterance)
    except ConversationStoreError as e:
        LOG.warning(f"not answering a QUERY: {e}")
        yield None
        return
    answer = _Answer(protocol.clock)
    run = _engine_job(protocol, session_id, lang, messages, answer)
    try:
        protocol.executor.submit(session_id, run, group=group)
    except QueueFull as e:
        LOG.warning(f"not answering a QUERY: hub busy ({e})")
        yield None
        return
    timeout = protocol.settings.timeout
    said: List[str] = []
    ended: Optional[str] = None
    try:
        while ended is None:
            item = answer.take(timeout)
            if item is _TIMED_OUT:
                LOG.warning(f"QUERY answer ended early: the engine gave no sentence for "
                            f"{timeout:g} s")
                protocol.executor.cancel(session_id, run)   # if it never started
                ended = EndReason.TIMEOUT.value
            elif item is _END:
                ended = ANSWERED if said else EndReason.NOT_UNDERSTOOD.value
            elif isinstance(item, Exception):
                LOG.warning(f"QUERY answer ended early: engine raised "
                            f"{type(item).__name__}: {shown(str(item), 300, quote=False)}")
                ended = EndReason.ENGINE_ERROR.value
            else:
                said.append(item)
                yield item
    finally:
        answer.abandoned.set()
        if history:     # a consumer that stopped listening heard what it was given
            protocol.keep_exchange(EndedExchange(history, utterance, said, ended or (
                STOPPED if said else EndReason.NOT_UNDERSTOOD.value), earlier))
    yield None


def answer_client_query(protocol: QueryHost, utterance: str, lang: str,
                        client: Any) -> Iterator[Optional[str]]:
    """As `stream_answer`, counted against the asking connection's client (access key), with
    that client's earlier QUERY exchanges as the engine's history."""
    try:
        history = engine_session_id(protocol.store.secret(), connection_client(client),
                                    QUERY_SESSION)
    except ConversationStoreError as e:
        LOG.warning(f"not answering a QUERY: {e}")
        return iter([None])
    protocol.satellites.touch(history, client, str(getattr(client, "peer", "")))
    return stream_answer(protocol, utterance, lang, group=connection_client(client),
                         history=history)
