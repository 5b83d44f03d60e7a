"""`HiveMindChatAgent`: the ovos-plugin-manager ChatEngine shell around sessions, pool and turns."""
import asyncio
import threading
import time
import weakref
from typing import Any, AsyncIterator, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from ovos_plugin_manager.templates.agents import AgentMessage, ChatEngine, MessageRole
from ovos_utils.log import LOG

from hivemind_chat_agent.background import off_loop
from hivemind_chat_agent.client.abandonment import Abandonment, TurnAbandoned
from hivemind_chat_agent.client.chat_turn import ChatTurn
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.client.observer import NO_OBSERVER, ClientObserver
from hivemind_chat_agent.client.pool import ConnectionPool
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.client.session_store import SessionStore
from hivemind_chat_agent.client.subscriptions import Subscribers, Subscription
from hivemind_chat_agent.client.transport import preferred_ciphers
from hivemind_chat_agent.client.turn_driver import TurnDriver, start_driver
from hivemind_chat_agent.core.outcomes import TurnStatus
from hivemind_chat_agent.core.protocol_names import CHAT_PLUGIN_NAME
from hivemind_chat_agent.core.refusals import UtteranceTopic
from hivemind_chat_agent.errors import AgentClosedError, HiveMindChatError


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
            config, session, self.sessions, self.subscribers.deliver, topic=self.topic,
            on_speaker=self._heard_speaker, on_turn_records=self._heard_turn_records))
        # the hub answers a repeated turn id from its record (our plugin): a turn whose
        # connection is lost before its end is sent once more, on a new connection
        self.hub_keeps_turns = False
        self._locks: "weakref.WeakValueDictionary[str, _SessionLock]" = \
            weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()
        self._running: Dict[str, ChatTurn] = {}   # session -> its turn in progress
        self._closed = False
        self.observer: ClientObserver = NO_OBSERVER   # observe(): a front's metrics
        preferred_ciphers()   # first connection should not pay for reading the CPU flags

    # ---- ChatEngine API ----
    def continue_chat(self, messages: List[AgentMessage], session_id: str = "default",
                      lang: Optional[str] = None, units: Optional[str] = None,
                      tools: Any = None) -> AgentMessage:
        turn, driver = self._send(messages, session_id, lang, units)
        driver.adopt()
        driver.run()          # here: the caller waits anyway, and a thread would cost a hop
        return AgentMessage(role=MessageRole.ASSISTANT, content=turn.full_response(0))

    def stream_sentences(self, messages: List[AgentMessage], session_id: str = "default",
                         lang: Optional[str] = None,
                         units: Optional[str] = None) -> Iterator[str]:
        """Yields each sentence the moment its `speak` arrives (no polling). The utterance is
        sent at the first `next()`; closing the generator before the end (or dropping it)
        stops the hub's answer, as `ChatTurn.terminate()` does."""
        turn = self.begin(messages, session_id, lang, units)
        try:
            yield from turn
        finally:
            turn.terminate()

    def stream_tokens(self, messages: List[AgentMessage], session_id: str = "default",
                      lang: Optional[str] = None, units: Optional[str] = None) -> Iterable[str]:
        return self.stream_sentences(messages, session_id, lang, units)

    # ---- turn handles ----
    def begin(self, messages: List[AgentMessage], session_id: str = "default",
              lang: Optional[str] = None, units: Optional[str] = None,
              callback: Optional[Callable[[str], Any]] = None,
              site_id: Optional[str] = None) -> ChatTurn:
        """Send the latest user utterance and return its `ChatTurn` at once: iterate it, give
        it a callback, watch its status, or terminate it (barge-in). Waits only for an earlier
        turn of the same session to end, and for the connection (typed errors raise here)."""
        turn, driver = self._send(messages, session_id, lang, units, site_id)
        if callback is not None:
            turn.set_callback_func(callback)
        start_driver(driver)
        return turn

    async def abegin(self, messages: List[AgentMessage], session_id: str = "default",
                     lang: Optional[str] = None, units: Optional[str] = None,
                     callback: Optional[Callable[[str], Any]] = None,
                     site_id: Optional[str] = None) -> ChatTurn:
        """`begin()` for asyncio: the sending (and any wait for the session or the connection)
        happens on a thread of the turn's, never on the event loop."""
        abandonment = Abandonment()      # cancelled before it is sent: never sent

        def send_then_drive(settle):
            try:
                turn, driver = self._send(messages, session_id, lang, units, site_id,
                                          abandonment)
            except BaseException as e:
                settle(None, e)
                return
            driver.adopt()
            settle(turn, None)
            driver.run()
        try:
            turn = await off_loop(send_then_drive, abandon=ChatTurn.terminate)
        except asyncio.CancelledError:
            abandonment.give_up()
            raise
        if callback is not None:
            turn.set_callback_func(callback)
        return turn

    async def acontinue_chat(self, messages: List[AgentMessage], session_id: str = "default",
                             lang: Optional[str] = None, units: Optional[str] = None,
                             tools: Any = None) -> AgentMessage:
        started: List[ChatTurn] = []
        gave_up: List[bool] = []      # each side appends first, then reads the other's list

        abandonment = Abandonment()

        def send_and_drive(settle):   # the whole turn on a worker: one wake-up of the loop
            try:
                turn, driver = self._send(messages, session_id, lang, units,
                                          abandonment=abandonment)
            except BaseException as e:
                settle(None, e)
                return
            driver.adopt()
            started.append(turn)
            if gave_up:
                turn.terminate()
            driver.run()
            settle(turn, None)
        try:
            turn = await off_loop(send_and_drive)
        except asyncio.CancelledError:
            gave_up.append(True)
            abandonment.give_up()
            for turn in started:      # the caller gave up on it: stop the hub's answer
                turn.terminate()
            raise
        return AgentMessage(role=MessageRole.ASSISTANT, content=turn.full_response(0))

    async def astream_sentences(self, messages: List[AgentMessage], session_id: str = "default",
                                lang: Optional[str] = None,
                                units: Optional[str] = None) -> AsyncIterator[str]:
        turn = await self.abegin(messages, session_id, lang, units)
        try:
            async for sentence in turn:
                yield sentence
        finally:
            turn.terminate()

    def observe(self, observer: ClientObserver) -> None:
        """Tell `observer` (client/observer.py) of every turn's start, first sentence and
        end, and of every reconnect and resend, from now on."""
        self.observer = self.pool.observer = observer

    def warm_up(self) -> None:
        """Connect now, not at the first turn: a wrong key or a dead hub raises its typed error
        here, and on a 4.x hub `spare_connections` handshaken connections start filling, so a
        new session's first turn pays no handshake. Servers call it at start."""
        self._check_open()
        self.pool.warm()

    async def awarm_up(self) -> None:
        """`warm_up` off the event loop."""
        def work(settle):
            self.warm_up()
            settle(None, None)
        await off_loop(work)

    def subscribe(self, session_id: str = "default",
                  callback: Optional[Callable[[str], None]] = None) -> Subscription:
        """What the hub says in this session between turns (alarms, reminders, late answers).

        Iterate the subscription for each sentence (a `str`), or pass `callback`, called with
        each one on the subscription's own thread; both end at its `close()`. Opens the
        session's connection now, so speech can reach it, and keeps it open while idle."""
        self._check_open()
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

    def stop_session(self, session_id: str = "default") -> bool:
        """Stop this session's turn in progress, as `ChatTurn.terminate()` does (barge-in). A
        hub relaying through this agent calls it when its satellite stops an answer. True if
        a turn was running."""
        with self._locks_guard:
            turn = self._running.get(self.sessions.resolve(session_id))
        if turn is None:
            return False
        turn.terminate()
        return True

    def forget_session(self, session_id: str) -> None:
        """Drop this conversation's state here (into the store, when one is configured), so
        its next turn starts from what the caller declares. A hub relaying through this agent
        calls it when its satellite's session ends."""
        self.sessions.forget(self.sessions.resolve(session_id))

    def seed_session(self, session_id: str, state: Dict[str, Any]) -> bool:
        """Start this conversation from `state` (another's `session_snapshot`: a front forking
        a conversation, as the OpenAI API's history does), unless it is known here already;
        its next turn sends that state. False when it was known or `state` is no Session."""
        return self.sessions.seed(self.sessions.resolve(session_id), state)

    def session_snapshot(self, session_id: str) -> Optional[Dict[str, Any]]:
        """This conversation's OVOS Session as it stands now (serialized), or None when it is
        not known here: what a front keeps to fork the conversation later (`seed_session`)."""
        return self.sessions.snapshot(self.sessions.resolve(session_id))

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
    def _send(self, messages, session_id, lang, units, site_id: Optional[str] = None,
              abandonment: Optional[Abandonment] = None) -> Tuple[ChatTurn, TurnDriver]:
        utterance = latest_user_utterance(messages)
        observer, began = self.observer, time.monotonic()
        observer.turn_began()
        try:
            sid = self.sessions.resolve(session_id)
            slock = self._session_lock(sid)
            slock.lock.acquire()   # two turns of one session never interleave on the wire
            driver = TurnDriver(self, sid, slock, began)
            try:
                self._check_open()
                session = self.sessions.for_turn(sid, lang, units, site_id)
            except BaseException:
                slock.lock.release()
                raise
            turn = driver.turn = ChatTurn(sid, utterance, lang or session.lang)
            driver.send(session, utterance, abandonment)   # gives everything back if it raises
        except BaseException as e:    # never sent: the observer hears its end here
            observer.turn_ended(TurnStatus.CANCELLED if isinstance(e, TurnAbandoned) else None,
                                time.monotonic() - began)
            raise
        with self._locks_guard:
            self._running[sid] = turn
        driver.on_release = lambda: self._turn_ended(sid, turn)
        return turn, driver

    def _turn_ended(self, sid: str, turn: ChatTurn) -> None:
        with self._locks_guard:
            if self._running.get(sid) is turn:
                del self._running[sid]

    def _check_open(self) -> None:
        if self._closed:
            raise AgentClosedError("this agent was shut down; create a new one to chat again")

    def _heard_speaker(self, speaker: str) -> None:
        """The hub answers through our plugin: its churn hazards are not there (churn_gate)."""
        if speaker == CHAT_PLUGIN_NAME and self.pool.gate.stagger:
            LOG.debug("the hub answers through hivemind-chat-agent-plugin: turns need no spacing")
            self.pool.gate.relax()

    def _heard_turn_records(self) -> None:
        self.hub_keeps_turns = True

    @property
    def closed(self) -> bool:
        """shutdown() was called: no more turns."""
        return self._closed

    def sessions_in_use(self, current: str) -> set:
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
