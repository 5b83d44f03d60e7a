"""`ChatAgentProtocol`: a hivemind-core agent protocol that answers satellites with a ChatEngine.

hivemind-core hands every satellite BUS message to `bus.emit` on its IO loop thread, after its
own key, allowed-type and session checks. This class does only the minimum there (look the
satellite up, queue the turn) and runs the engine on a bounded pool of workers, one satellite
session's turns in order. Replies go back through the IO loop to the satellite that asked, and
to no other; a turn always ends with exactly one `ovos.utterance.handled`. How a reply is
encrypted and written depends on the hub's generation (4.x password handshake, 5.x Noise):
hub/links.py picks that per connection. QUERY (`natural_language_query`) is in hub/query.py.

An engine that speaks between turns (`subscribe(session_id, callback)`, as `HiveMindChatAgent`
relaying to another hub does: alarms, reminders, late answers) has that speech forwarded to
the satellite session it belongs to, while the satellite is connected.
"""
import dataclasses
import time
from threading import Lock
from typing import Any, Dict, Iterator, List, Optional

from hivemind_plugin_manager.protocols import AgentProtocol, ClientCallbacks
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session, SessionManager
from ovos_plugin_manager.templates.agents import ChatEngine
from ovos_utils.log import LOG
from ovos_utils.xdg_utils import xdg_data_home

from hivemind_chat_agent import compat
from hivemind_chat_agent.compat import register_session as register
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.conversation import conversation_for_turn
from hivemind_chat_agent.core.limits import id_refusal, shown, shown_name
from hivemind_chat_agent.core.protocol_names import STOP_TYPES, UTTERANCE_TYPES
from hivemind_chat_agent.core.replies import first_utterance
from hivemind_chat_agent.core.satellites import (
    SatelliteSessions,
    client_fingerprint,
    engine_session_id,
)
from hivemind_chat_agent.core.transcript import Exchange
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import ConversationStoreError, IdentifierTooLongError, ReplyNotSent
from hivemind_chat_agent.hub.agent_bus import AgentBus
from hivemind_chat_agent.hub.asides import Asides
from hivemind_chat_agent.hub.connections import (
    connection_client,
    connection_closed,
    connection_token,
    mark_closed,
)
from hivemind_chat_agent.hub.conversation_store import TurnRecordsFull
from hivemind_chat_agent.hub.hub_turn import HubTurn, OpenTurns, agent_messages
from hivemind_chat_agent.hub.links import install_links, link_for
from hivemind_chat_agent.hub.loop_clock import IOLoopClock
from hivemind_chat_agent.hub.query import stream_answer
from hivemind_chat_agent.hub.serial_executor import KeyedSerialExecutor, QueueFull
from hivemind_chat_agent.hub.settings import PLUGIN_NAME, HubSettings, load_engine
from hivemind_chat_agent.hub.stops import stop_turns
from hivemind_chat_agent.hub.stores import open_store
from hivemind_chat_agent.hub.turn_records import run_here, turn_id_of

__all__ = ["ChatAgentProtocol", "HubSettings", "PLUGIN_NAME", "load_engine"]

QUERY_SESSION = "hivemind-query"   # the declared session id a client's QUERYs are kept under


class ChatAgentProtocol(AgentProtocol):
    """hivemind-core agent protocol plugin `hivemind-chat-agent-plugin`."""

    def __init__(self, config: Optional[Dict[str, Any]] = None, bus=None, hm_protocol=None,
                 callbacks: Optional[ClientCallbacks] = None, engine: Optional[ChatEngine] = None,
                 clock: Optional[Clock] = None):
        callbacks = dataclasses.replace(callbacks or ClientCallbacks())   # not the caller's
        core_on_disconnect = callbacks.on_disconnect
        callbacks.on_disconnect = lambda client: (self._on_connection_closed(client),
                                                  core_on_disconnect(client))
        super().__init__(config=dict(config or {}), bus=bus or AgentBus(),
                         hm_protocol=hm_protocol, callbacks=callbacks)
        if engine is not None:
            self.config.setdefault("engine", type(engine).__name__)
        self.settings = HubSettings.from_dict(self.config)
        self.clock: Clock = clock or IOLoopClock()   # turn timeouts and the session sweep
        self.engine = engine or load_engine(self.settings.engine, self.settings.engine_config)
        self.executor = KeyedSerialExecutor(
            self.settings.workers, self.settings.max_queue, self.settings.max_queue_per_session,
            max_pending_per_group=self.settings.max_queue_per_client,
            workers_per_group=self.settings.workers_per_client)
        self.satellites = SatelliteSessions(self.settings.session_ttl,
                                            self.settings.max_sessions_per_client)
        self._satellites_lock = Lock()      # IO loop (touch, disconnect, sweep) vs workers
        self.asides = Asides(self.engine, self._send, self._satellites_lock)
        self._sweeping = False
        self.open_turns = OpenTurns()
        self.store = open_store(self.settings.conversation_store, self.settings.history_turns,
                                self.settings.history_bytes, self.settings.session_ttl,
                                data_home=lambda: str(xdg_data_home()),   # beside core's db
                                max_sessions_per_client=self.settings.max_sessions_per_client,
                                max_turn_records_per_client=(
                                    self.settings.max_turn_records_per_client))
        install_links()
        compat.for_hub()   # stock satellites pick JSON-B91, whose C codec leaks
        for msg_type in UTTERANCE_TYPES:
            self.bus.on(msg_type, self._on_utterance)
        for msg_type in STOP_TYPES:
            self.bus.on(msg_type, self._on_stop)
        # no "hive.client.disconnect" handler: 4.0 and 5.x both call callbacks.on_disconnect
        # with the connection object first, and that names every session it used

    @property
    def _secret(self) -> bytes:
        """Read (or created) on the first utterance, when the hub's XDG dirs are in place; from
        the shared store when there is one (ConversationStoreError while it is down)."""
        return self.store.secret()

    # ---- IO loop thread: keep it short ----
    def _satellite(self, message: Message, what: str):
        """(client, peer, its declared Session, engine session id) of an authenticated
        satellite's message, or None (logged) for one not to act on. IdentifierTooLongError
        for a declared session id over core/limits.MAX_ID_BYTES or not UTF-8 (nothing of it
        is kept), ConversationStoreError when the store holding the hub secret is down."""
        peer = message.context.get("peer") or message.context.get("source")
        client = self.clients.get(peer)
        if client is None:
            LOG.info(f"ignoring {what} from {shown_name(peer)}: no such satellite is connected")
            return None
        link = link_for(client)
        if link is None:
            LOG.warning(f"refusing {what} from {shown_name(peer)}: its connection "
                        f"({type(client).__name__}) is of no hivemind-core generation this "
                        "plugin knows (4.x or 5.x); nothing is answered")
            return None
        if not link.authenticated(client):
            LOG.warning(f"refusing {what} from {shown_name(peer)}: it was not encrypted under "
                        "the connection's key (the sender knows the access key, not the "
                        "password); nothing is answered")
            return None
        sat_session = message.context.get("session")
        if not isinstance(sat_session, dict) or not isinstance(sat_session.get("session_id"),
                                                                str):
            sat_session = {"session_id": "default"}
        # keyed by the id the satellite declared, so its engine session is the same on 4.x
        # and 5.x hubs (and across an upgrade); replies carry that id back
        declared = link.declared_session_id(client, sat_session["session_id"])
        refusal = id_refusal("session id", declared)
        if refusal:
            raise IdentifierTooLongError(refusal)
        sat_session = dict(sat_session, session_id=declared)
        session_id = engine_session_id(self._secret, client.key, sat_session["session_id"])
        return client, peer, sat_session, session_id

    def _on_utterance(self, message: Message) -> None:
        from tornado.ioloop import IOLoop
        try:
            satellite = self._satellite(message, "an utterance")
        except ConversationStoreError as e:
            self._fail_unnamed(message, str(e), EndReason.STORE_UNAVAILABLE)
            return
        except IdentifierTooLongError as e:
            self._fail_unnamed(message, str(e), EndReason.ID_TOO_LONG)
            return
        if satellite is None:
            return
        client, peer, sat_session, session_id = satellite
        turn_id = turn_id_of(message.context)
        refusal = id_refusal("turn id", turn_id)
        if refusal:
            self._fail_unnamed(message, refusal, EndReason.ID_TOO_LONG)
            return
        utterance = first_utterance(message.data)
        loop = IOLoop.current()
        with self._satellites_lock:
            evicted = self.satellites.touch(session_id, connection_token(client), peer,
                                            self.clock.now(), connection_client(client))
        self._forget_sessions(evicted)
        if not self._sweeping:
            self._sweeping = True
            self.clock.call_later(self._sweep_interval, self._sweep)
        turn = HubTurn(self, message, client, peer, loop, utterance or "", sat_session,
                       session_id)
        turn.turn_id = turn_id
        turn.store_client = client_fingerprint(self._secret, connection_client(client))
        if not (utterance or "").strip():   # still a turn: it gets its end, never silence
            turn.finish(failed=True, why="the utterance has no text", reason=EndReason.NO_TEXT)
            return
        turn.job = lambda: self._run(turn)
        self.open_turns.add(turn)
        try:
            self.executor.submit(session_id, turn.job, group=connection_client(client))
        except QueueFull as e:
            turn.finish(failed=True, why=f"hub busy ({e})", reason=EndReason.BUSY)
            return
        self._watch(turn)

    def _fail_unnamed(self, message: Message, why: str, reason: EndReason) -> None:
        """IO loop: an utterance whose engine session cannot be named (the store holding the
        hub secret is down, an id over its bound) still gets its end, with the reason; the
        one log line is the turn's (`why` is bounded)."""
        from tornado.ioloop import IOLoop
        peer, sat_session = self._sender(message)
        turn = HubTurn(self, message, self.clients.get(peer), peer, IOLoop.current(), "",
                       sat_session, "")
        turn.finish(failed=True, why=why, reason=reason)

    @staticmethod
    def _sender(message: Message):
        """(peer, Session as sent) of a message whose satellite was not looked up."""
        sat_session = message.context.get("session")
        return (message.context.get("peer") or message.context.get("source"),
                sat_session if isinstance(sat_session, dict) else {"session_id": "default"})

    def _on_stop(self, message: Message) -> None:
        """IO loop: a satellite stops its session's answer (hub/stops.py)."""
        stop_turns(self, message)

    def _watch(self, turn: HubTurn) -> None:
        """Rolling timeout on the clock's timers (the IO loop's): no thread per turn."""
        if turn.finished:
            return
        remaining = turn.deadline - self.clock.now()
        if remaining > 0:
            turn.timer = self.clock.call_later(remaining, lambda: self._watch(turn))
        elif turn.finish(failed=True, why=f"engine gave no sentence for "
                                          f"{self.settings.timeout:g} s", reason=EndReason.TIMEOUT):
            self.executor.cancel(turn.session_id, turn.job)   # if it never started

    @property
    def _sweep_interval(self) -> float:
        return min(self.settings.session_ttl, 60.0)

    def _sweep(self) -> None:
        """Forget sessions unseen for session_ttl, on a timer of the clock's (no thread)."""
        with self._satellites_lock:
            expired = self.satellites.expired(self.clock.now())
        self._forget_sessions(expired)
        self.clock.call_later(self._sweep_interval, self._sweep)

    def _on_connection_closed(self, client) -> None:
        """IO loop, as the connection goes: its sessions, and its old names in core's table.
        hivemind-core 4.0 files a connection under a new peer string at every HELLO and
        forgets only the last one, so each session id a connection ever declared would keep
        the whole connection alive (5.x drops the old name at each HELLO itself: there this
        finds nothing)."""
        clients = self.clients      # {} before hivemind-core binds the plugin
        for peer in [p for p, c in list(clients.items()) if c is client and p != client.peer]:
            clients.pop(peer, None)
        mark_closed(client)   # replies still on their way to it are not sent
        with self._satellites_lock:     # by the object: its peer string may be stale
            gone = self.satellites.closed(connection_token(client))
        self._forget_sessions(gone)

    def _forget_if_untracked(self, session_id: str) -> None:
        """A turn that outlived its satellite must not leave its Session behind."""
        with self._satellites_lock:
            tracked = session_id in self.satellites
        if not tracked:
            self._forget_sessions([session_id])

    def _forget_sessions(self, session_ids) -> None:
        """These satellite sessions are gone: their engine Sessions and speech subscriptions."""
        forget = getattr(self.engine, "forget_session", None)   # a relay's upstream state
        for session_id in session_ids:
            SessionManager.sessions.pop(session_id, None)
            self.store.forget(session_id)
            self.asides.stop(session_id)
            if callable(forget):
                try:
                    forget(session_id)
                except Exception as e:   # an engine's bug must not stop the forgetting
                    LOG.warning(f"engine could not forget a session: {type(e).__name__}")

    def deliver(self, turn: HubTurn, reply: Message) -> None:
        """Hand a reply to the IO loop (the only thread that may write to a socket)."""
        turn.loop.add_callback(self._send, turn.client, turn.peer, reply)

    def _send(self, client, peer: str, reply: Message) -> None:
        """IO loop: write `reply` to the connection `client` (by the object, not by its peer
        name, which a satellite's HELLO changes on 5.x while the connection stays). A reply
        that cannot go out is a WARNING with the reason, never silence."""
        link = link_for(client)
        try:
            if connection_closed(client):
                raise ReplyNotSent("the satellite is no longer connected")
            if link is None:
                raise ReplyNotSent(f"unknown connection type {type(client).__name__}")
            link.send(client, reply)
        except ReplyNotSent as e:
            LOG.warning(f"not sending {reply.msg_type} to {shown_name(peer)}: {e}")
        except Exception as e:
            LOG.warning(f"could not send {reply.msg_type} to {shown_name(peer)}: "
                        f"{type(e).__name__}: {shown(str(e), 200, quote=False)}")

    # ---- worker thread ----
    def _run(self, turn: HubTurn) -> None:
        if turn.finished:          # timed out while queued
            return
        if connection_closed(turn.client):   # the satellite left while its turn was queued
            turn.abandon()
            return
        turn.deadline = self.clock.now() + self.settings.timeout
        try:
            begun = self.store.begin(turn.session_id, turn.turn_id, client=turn.store_client)
            if not run_here(self.store, turn, begun.record, self.clock.sleep):
                return     # answered from the turn's record (hub/turn_records.py)
        except (ConversationStoreError, TurnRecordsFull) as e:
            turn.finish(failed=True, why=str(e), reason=EndReason.BUSY if isinstance(
                e, TurnRecordsFull) else EndReason.STORE_UNAVAILABLE)
            self._forget_if_untracked(turn.session_id)
            return
        turn.earlier, kept = begun.history, begun.session
        sess = Session.deserialize(conversation_for_turn(turn.satellite_session,
                                                         turn.session_id, kept))
        register(sess)
        began = sess.serialize()
        try:
            self.asides.follow(turn)
            turn.converse(self.engine, sess, agent_messages(begun.history, turn.utterance))
            self._keep_session(turn.session_id, began, turn.store_client)
        finally:
            self._forget_if_untracked(turn.session_id)

    def _keep_session(self, session_id: str, began: Dict[str, Any], client: str) -> None:
        """The Session as the engine left it, written only when it changed."""
        sess = SessionManager.sessions.get(session_id)
        now = sess.serialize() if sess is not None else began
        if now == began:
            return
        try:
            self.store.keep_session(session_id, now, client=client)
        except ConversationStoreError as e:   # answered already; the next turn may fail
            LOG.warning(f"the session after a turn was not kept: {e}")

    def history(self, session_id: str) -> List[Exchange]:
        """The session's kept exchanges, oldest first (a QUERY's engine gets them)."""
        return self.store.history(session_id)

    def record_exchange(self, turn: HubTurn, ended: str) -> None:
        """A turn ended: keep it in its session's transcript and its record (a replayed one
        is in both already)."""
        if turn.replayed or ended == EndReason.STORE_UNAVAILABLE.value:
            return       # (the store did not answer this turn: no second try to write it)
        with self._satellites_lock:
            tracked = turn.session_id in self.satellites
        if not (tracked or turn.owns_record):
            return
        time.sleep(0)    # the IO loop writes the end (queued just now) before this store write
        try:
            self.store.finish(turn.session_id, turn.turn_id if turn.owns_record else "",
                              Exchange(turn.utterance, "\n".join(turn.sentences), ended),
                              turn.sentences, turn.earlier, keep_exchange=tracked,
                              client=turn.store_client)
        except ConversationStoreError as e:   # the satellite has its answer
            LOG.warning(f"a turn's exchange and record were not kept: {e}")

    def record(self, session_id: str, utterance: str, sentences: List[str], ended: str,
               earlier: List[Exchange]) -> None:
        """Keep an exchange in the session's transcript (`earlier`: the history its answer
        began with), unless the session is gone (a turn that outlived its satellite must not
        bring the session back)."""
        with self._satellites_lock:
            if session_id not in self.satellites:
                return
        try:
            self.store.finish(session_id, "", Exchange(utterance, "\n".join(sentences), ended),
                              sentences, earlier, keep_exchange=True)
        except ConversationStoreError as e:   # the satellite has its answer; history lacks it
            LOG.warning(f"an exchange was not kept: {e}")

    # ---- hivemind-core's QUERY / CASCADE (abstract from hivemind-plugin-manager 0.7) ----
    def natural_language_query(self, utterance: str, lang: str) -> Iterator[Optional[str]]:
        """The engine's sentences as they come, then None (also after a failure, which is a
        WARNING). Runs on core's query worker; the engine on this plugin's bounded workers."""
        return stream_answer(self, utterance, lang, group="query")

    def answer_query(self, utterance: str, lang: str, client=None) -> Iterator[Optional[str]]:
        """As `natural_language_query`, counted against the asking client's worker share, with
        the client's earlier QUERY exchanges as the engine's history (one conversation per
        access key, released like a satellite session)."""
        if client is None:
            return stream_answer(self, utterance, lang, group="query")
        try:
            history = engine_session_id(self._secret, connection_client(client), QUERY_SESSION)
        except ConversationStoreError as e:
            LOG.warning(f"not answering a QUERY: {e}")
            return iter([None])
        with self._satellites_lock:
            evicted = self.satellites.touch(history, connection_token(client),
                                            str(getattr(client, "peer", "")), self.clock.now(),
                                            connection_client(client))
        self._forget_sessions(evicted)
        return stream_answer(self, utterance, lang, group=connection_client(client),
                             history=history)

    def __repr__(self) -> str:
        # the dataclass repr would print config, i.e. a relay's upstream key and password, and
        # hivemind-core logs client objects (which reference this) at DEBUG
        return (f"ChatAgentProtocol(engine={self.settings.engine!r}, "
                f"workers={self.settings.workers}, timeout={self.settings.timeout:g})")

    def shutdown(self) -> None:
        self.asides.stop_all()
        self.executor.shutdown(wait=False)
        self.store.close()
        stop = getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()

