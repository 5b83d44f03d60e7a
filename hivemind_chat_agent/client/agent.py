"""`HiveMindChatAgent`: the ovos-plugin-manager ChatEngine shell around sessions, pool and turns."""
import queue
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from ovos_plugin_manager.templates.agents import AgentMessage, ChatEngine, MessageRole
from ovos_utils.log import LOG

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection, TurnHandle
from hivemind_chat_agent.client.transport import preferred_ciphers
from hivemind_chat_agent.core.refusals import UtteranceTopic
from hivemind_chat_agent.errors import (AgentClosedError, ConnectionLostError,
                                        HiveMindChatError, HubBusyError, HubEngineError,
                                        ReplyTooLargeError, TurnTimeoutError)
from hivemind_chat_agent.client.pool import ConnectionPool
from hivemind_chat_agent.client.session_store import SessionStore
from hivemind_chat_agent.core.sessions import SessionBook
from hivemind_chat_agent.client.subscriptions import Subscribers, Subscription
from hivemind_chat_agent.core.turns import Ended, Sentence, TurnState


class _SessionLock:
    """A lock that can live in a WeakValueDictionary, so idle sessions cost nothing."""
    __slots__ = ("lock", "__weakref__")

    def __init__(self):
        self.lock = threading.Lock()


class HiveMindChatAgent(ChatEngine):
    """Chat with a remote OVOS hub over an authenticated, encrypted HiveMind connection.

    Stateless like the OVOS messagebus chat agent: only the latest user message is sent, and
    multi-turn state travels in the OVOS Session kept in SessionManager per session_id.
    """

    def __init__(self, config: Optional[Dict[str, Any]] = None):
        super().__init__(config)
        self.settings = cfg = ClientConfig.from_dict(self.config)
        store = None
        if cfg.session_store:
            store = SessionStore(cfg.session_store, cfg.host, cfg.port, cfg.key,
                                 max_sessions=cfg.session_store_max, ttl=cfg.session_store_ttl)
        self.sessions = SessionBook(cfg.default_session_id, cfg.site_id, store,
                                    max_sessions=cfg.max_sessions,
                                    idle_ttl=cfg.session_idle_ttl)
        self.subscribers = Subscribers()
        self.topic = UtteranceTopic(cfg.utterance_topic)   # learnt once per hub, for all
        self.pool = ConnectionPool(cfg, factory=lambda config, session: HubConnection(
            config, session, self.sessions, self.subscribers.deliver, topic=self.topic))
        self._locks: "weakref.WeakValueDictionary[str, _SessionLock]" = \
            weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()
        self._closed = False
        preferred_ciphers()   # first connection should not pay for reading the CPU flags

    # ---- ChatEngine API ----
    def continue_chat(self, messages: List[AgentMessage], session_id: str = "default",
                      lang: Optional[str] = None, units: Optional[str] = None,
                      tools: Any = None) -> AgentMessage:
        sentences = list(self._turn(messages, session_id, lang, units))
        return AgentMessage(role=MessageRole.ASSISTANT, content="\n".join(sentences))

    def stream_sentences(self, messages: List[AgentMessage], session_id: str = "default",
                         lang: Optional[str] = None,
                         units: Optional[str] = None) -> Iterable[str]:
        """Yields each sentence the moment its `speak` arrives (a blocking queue, no polling).

        The session is locked while the generator is open: read it to the end or `close()` it
        (dropping the last reference does that too) before the next turn of that session."""
        return self._turn(messages, session_id, lang, units)

    def stream_tokens(self, messages: List[AgentMessage], session_id: str = "default",
                      lang: Optional[str] = None, units: Optional[str] = None) -> Iterable[str]:
        return self.stream_sentences(messages, session_id, lang, units)

    def subscribe(self, session_id: str = "default",
                  callback: Optional[Callable[[str], None]] = None) -> Subscription:
        """What the hub says in this session between turns (alarms, reminders, late answers).

        Iterate the subscription for each sentence (a `str`), or pass `callback`, called with
        each one on the subscription's own thread; both end at its `close()`. Opens the
        session's connection now, so speech can reach it, and keeps it open while idle."""
        if self._closed:
            raise AgentClosedError("this agent was shut down; create a new one to chat again")
        sid = self.sessions.resolve(session_id)
        sub = Subscription(sid, callback, on_close=self._unsubscribe)
        if self.subscribers.add(sub):
            self.pool.pin(sid)
        try:
            with self._session_lock(sid).lock:
                self.pool.release(self.pool.acquire(self.sessions.for_turn(sid)))
        except BaseException:
            sub.close()
            raise
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        if self.subscribers.remove(sub):
            self.pool.unpin(sub.session_id)

    def report_audio_end(self, session_id: str = "default") -> None:
        """With `plays_audio`: the caller has finished playing this session's speech, so
        skills waiting on it (speak with wait=True, get_response) go on."""
        sid = self.sessions.resolve(session_id)
        conn = self.pool.peek(sid)
        if conn is not None:
            conn.report_audio_end(session_id=sid)

    def forget_session(self, session_id: str) -> None:
        """Drop this conversation's state here (into the store, when one is configured), so
        its next turn starts from what the caller declares. A hub relaying through this agent
        calls it when its satellite's session ends."""
        self.sessions.forget(self.sessions.resolve(session_id))

    def shutdown(self) -> None:
        """Close every connection and stop every thread of this agent; turns in flight end."""
        self._closed = True
        self.subscribers.close_all()
        self.pool.close_all()

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.shutdown()

    # ---- one turn ----
    def _turn(self, messages, session_id, lang, units) -> Iterator[str]:
        utterance = latest_user_utterance(messages)
        sid = self.sessions.resolve(session_id)
        slock = self._session_lock(sid)
        with slock.lock:   # two turns of one session never interleave on the wire
            if self._closed:
                raise AgentClosedError("this agent was shut down; create a new one to chat again")
            session = self.sessions.for_turn(sid, lang, units)
            conn = self.pool.acquire(session)      # leased: eviction leaves it alone
            clean = lost = False
            try:
                with self.pool.gate.turn():
                    handle = conn.start_turn(session, utterance, uuid.uuid4().hex,
                                             self.settings.timeout)
                    try:
                        for event in self._events(conn, handle):
                            if isinstance(event, Sentence):
                                yield event.text
                            else:
                                # a refused turn leaves the stream intact: keep it
                                lost = event.state is TurnState.LOST and event.kind != "refused"
                                clean = self._outcome(event, handle)
                    finally:
                        if not handle.turn.state.is_final:
                            conn.abort(handle, "the caller stopped reading the answer")
                        conn.finish_turn(handle)
            finally:
                self.pool.release(conn)
                self.sessions.save(sid)
                self.sessions.trim(keep=self._in_use(sid))
                # Late replies of an unfinished turn carry its tag and cannot reach the next
                # one, so the connection is kept (reconnecting is what disturbs a hub), unless
                # it is gone or the hub strips our tags.
                if lost or (not clean and conn.untagged):
                    self.pool.discard(sid)

    @staticmethod
    def _events(conn: HubConnection, handle: TurnHandle):
        while True:
            remaining = handle.turn.deadline - time.monotonic()
            try:
                event = handle.events.get(timeout=max(remaining, 0.0))
            except queue.Empty:
                conn.expire(handle)   # re-checks the rolling deadline under the lock
                continue
            yield event
            if isinstance(event, Ended):
                return

    def _outcome(self, event: Ended, handle: TurnHandle) -> bool:
        """True when the connection is still in step with the hub; raises for failed turns."""
        state = event.state
        if state is TurnState.UNMATCHED and event.kind == "busy":
            raise HubBusyError(f"the hub is busy ({event.reason}); try again in a moment")
        if state is TurnState.UNMATCHED and event.kind in ("engine_error", "timeout"):
            raise HubEngineError(f"the hub's chat engine failed on this turn ({event.reason}); "
                                 "the hub's log has the details")
        if state.in_step:
            if state is not TurnState.HANDLED:
                LOG.debug(f"turn ended: {event.reason}")
            return True
        if self._closed:
            raise AgentClosedError("the agent was shut down during the turn")
        if state is TurnState.TIMED_OUT:
            if handle.turn.sentences:
                LOG.warning(f"hub stopped mid-answer ({event.reason}); returning what arrived")
                return False
            raise TurnTimeoutError(
                f"the hub accepted the utterance but sent no answer within "
                f"{self.settings.timeout:g} s; raise `timeout` or check that the hub's skills "
                "or engine are running")
        if state is TurnState.LOST and handle.error is not None:   # the hub refused it
            raise handle.error
        if state is TurnState.LOST and event.kind == "too_large":
            raise ReplyTooLargeError(event.reason)
        if state is TurnState.LOST and event.kind == "tampered":
            raise ConnectionLostError(f"{event.reason}; the answer was not accepted")
        if state is TurnState.LOST:
            raise ConnectionLostError(
                f"{event.reason}; the answer was lost. The next turn reconnects and the "
                "conversation's session is kept")
        return False

    def _in_use(self, current: str) -> set:
        """Sessions whose state must stay in memory: turns in progress, subscriptions."""
        with self._locks_guard:
            busy = {sid for sid, slock in list(self._locks.items()) if slock.lock.locked()}
        return busy | self.subscribers.sessions() | {current}

    def _session_lock(self, sid: str) -> _SessionLock:
        with self._locks_guard:
            slock = self._locks.get(sid)
            if slock is None:
                slock = self._locks[sid] = _SessionLock()
            return slock


def latest_user_utterance(messages: List[Any]) -> str:
    """The last USER message's text; accepts AgentMessage objects and OpenAI-style dicts."""
    for message in reversed(list(messages or [])):
        if isinstance(message, dict):
            role, content = message.get("role"), message.get("content")
        else:
            role, content = getattr(message, "role", None), getattr(message, "content", None)
        role = getattr(role, "value", role)
        if role == MessageRole.USER.value and isinstance(content, str) and content.strip():
            return content
    raise HiveMindChatError("no user message to send: `messages` must end with a USER message "
                            "that has text")
