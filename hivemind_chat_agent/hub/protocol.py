"""`ChatAgentProtocol`: a hivemind-core agent protocol that answers satellites with a ChatEngine.

hivemind-core hands every satellite BUS message to `bus.emit` on its IO loop thread, after its
own key, allowed-type and session checks. This class is the router there, doing the minimum
(look the sender up, follow its session, queue the turn) and writing replies; the engine runs
on a bounded pool of workers, one satellite session's turns in order (hub/turn_runner.py).
Replies go back through the IO loop to the satellite that asked, and to no other; a turn
always ends with exactly one `ovos.utterance.handled` (hub/hub_turn.py). How a reply is
encrypted and written depends on the hub's generation (4.x password handshake, 5.x Noise):
hub/dialects.py picks that per connection.

The jobs around it are each in a module of their own: who sent a message (hub/senders.py),
the satellite sessions followed and what goes with them (hub/satellite_book.py), the one path
an ended exchange takes into the store (hub/exchanges.py), a satellite's stop (hub/stops.py)
and QUERY (hub/query.py).

An engine that speaks between turns (`subscribe(session_id, callback)`, as `HiveMindChatAgent`
relaying to another hub does: alarms, reminders, late answers) has that speech forwarded to
the satellite session it belongs to, while the satellite is connected (hub/asides.py).
"""
import dataclasses
import threading
from typing import Any, Dict, Iterator, Optional

from hivemind_plugin_manager.protocols import AgentProtocol, ClientCallbacks
from ovos_bus_client.message import Message
from ovos_plugin_manager.templates.agents import ChatEngine
from ovos_utils.log import LOG
from ovos_utils.xdg_utils import xdg_data_home

from hivemind_chat_agent import compat
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.health import Verdict, readiness
from hivemind_chat_agent.core.limits import id_refusal
from hivemind_chat_agent.core.protocol_names import SPEAK_TYPE, STOP_TYPES, UTTERANCE_TYPES
from hivemind_chat_agent.core.replies import first_utterance
from hivemind_chat_agent.core.satellites import client_fingerprint
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import (
    ConversationStoreError,
    IdentifierTooLongError,
)
from hivemind_chat_agent.hub.agent_bus import AgentBus
from hivemind_chat_agent.hub.asides import Asides
from hivemind_chat_agent.hub.connections import close_connection, connection_client
from hivemind_chat_agent.hub.conversation_store import ConversationStore
from hivemind_chat_agent.hub.dialects import install_dialects, send_reply
from hivemind_chat_agent.hub.draining import (
    DRAINING_SPEECH,
    DRAINING_WHY,
    DrainReport,
    HubDrain,
    drain_at_exit,
)
from hivemind_chat_agent.hub.exchanges import EndedExchange, keep_exchange
from hivemind_chat_agent.hub.health_server import HealthServer
from hivemind_chat_agent.hub.hub_turn import HubTurn, OpenTurns
from hivemind_chat_agent.hub.metrics import (
    NO_METRICS,
    HubMetrics,
    NoMetrics,
    TimedStore,
    connections,
)
from hivemind_chat_agent.hub.query import answer_client_query, stream_answer
from hivemind_chat_agent.hub.reply_loops import OwnLoop, PluginClock, loop_here
from hivemind_chat_agent.hub.satellite_book import SatelliteBook
from hivemind_chat_agent.hub.senders import Sender, identify, sender_of
from hivemind_chat_agent.hub.serial_executor import KeyedSerialExecutor, QueueFull
from hivemind_chat_agent.hub.settings import PLUGIN_NAME, HubSettings, load_engine
from hivemind_chat_agent.hub.stops import stop_turns
from hivemind_chat_agent.hub.stores import open_store
from hivemind_chat_agent.hub.turn_records import turn_id_of
from hivemind_chat_agent.hub.turn_runner import run_turn

__all__ = ["ChatAgentProtocol", "HubSettings", "PLUGIN_NAME", "load_engine"]



class ChatAgentProtocol(AgentProtocol):
    """hivemind-core agent protocol plugin `hivemind-chat-agent-plugin` in chat mode."""

    def __init__(self, config: Optional[Dict[str, Any]] = None, bus=None, hm_protocol=None,
                 callbacks: Optional[ClientCallbacks] = None, engine: Optional[ChatEngine] = None,
                 clock: Optional[Clock] = None):
        super().__init__(config=dict(config or {}), bus=bus or AgentBus(),
                         hm_protocol=hm_protocol, callbacks=self._with_connection_hooks(callbacks))
        if engine is not None:
            self.config.setdefault("engine", type(engine).__name__)
        self.settings = HubSettings.from_dict(self.config)
        # replies and timers on the loop of the transport's thread, or on the plugin's own
        # where the transport runs none (MQTT, hivescope): hub/reply_loops.py
        self.own_loop = OwnLoop()
        self.clock: Clock = clock or PluginClock(self.own_loop)   # turn timeouts, the sweep
        self.engine = engine or load_engine(self.settings.engine, self.settings.engine_config)
        self.executor = KeyedSerialExecutor(
            self.settings.workers, self.settings.max_queue, self.settings.max_queue_per_session,
            max_pending_per_group=self.settings.max_queue_per_client,
            workers_per_group=self.settings.workers_per_client)
        # SIGTERM: hub/draining.py; the turns it waits for are the open ones
        self.drainer = HubDrain(self.settings.drain_timeout, lambda: self.clients.values(),
                                self.own_loop.get)
        self.open_turns = OpenTurns(on_removed=lambda turn: self.drainer.turn_ended(turn.client))
        self._draining = threading.Event()
        self._serving = True
        self.metrics = self._hub_metrics()
        self.store = self._open_store()
        self.asides = Asides(self.engine, self.send)
        self.satellites = SatelliteBook(self.settings, self.clock, self.store, self.asides,
                                        self.engine)
        install_dialects()
        # leak-free codecs (stock satellites pick JSON-B91), cheap LOG names, paced reads
        compat.for_hub(self.settings.loop_pacing)
        for msg_type in UTTERANCE_TYPES:
            self.bus.on(msg_type, self._on_utterance)
        for msg_type in STOP_TYPES:
            self.bus.on(msg_type, self._on_stop)
        # no "hive.client.disconnect" handler: 4.0 and 5.x both call callbacks.on_disconnect
        # with the connection object first, and that names every session it used
        self.health: Optional[HealthServer] = self._start_health()
        drain_at_exit(self)

    def _with_connection_hooks(self, callbacks: Optional[ClientCallbacks]) -> ClientCallbacks:
        """A copy of hivemind-core's callbacks (the caller's stay as they are) whose
        on_connect first tells the drainer (and keeps an MQTT connection's writes on one
        thread) and whose on_disconnect first lets the plugin forget the connection
        (`_on_connection_closed`); each then calls core's own."""
        callbacks = dataclasses.replace(callbacks or ClientCallbacks())
        core_on_connect, core_on_disconnect = callbacks.on_connect, callbacks.on_disconnect

        def on_connect(client: Any) -> None:
            self.drainer.connected(client, loop_here(self.own_loop))
            compat.mqtt_writes_on_its_thread(client)   # paho's writes on one thread (MQTT)
            core_on_connect(client)

        def on_disconnect(client: Any) -> None:
            self._on_connection_closed(client)
            core_on_disconnect(client)
        callbacks.on_connect, callbacks.on_disconnect = on_connect, on_disconnect
        return callbacks

    def _hub_metrics(self) -> NoMetrics:
        """The hub's Prometheus metrics when the health endpoint is on (the [metrics] extra,
        said by name if missing), else the no-op ones. Read lazily: the counts they report
        (sessions, connections, open turns) are filled in later."""
        if not self.settings.health:
            return NO_METRICS
        from hivemind_chat_agent.extras import require
        require("metrics", f'the "health" endpoint of {PLUGIN_NAME}')
        return HubMetrics(sessions=lambda: len(self.satellites),
                          satellites=connections(lambda: self.clients),
                          in_flight=lambda: len(self.open_turns))

    def _open_store(self) -> ConversationStore:
        """The conversation store the settings name, bounded per client; with the health
        endpoint on, a shared store's operations timed on the metrics (Redis: round trips that
        can be slow or fail). The memory store's are not: dictionary operations in this
        process, which cannot fail, where timing them cost 1.4 % of a turn's CPU
        (docs/performance.md)."""
        store = open_store(self.settings.conversation_store, self.settings.history_turns,
                           self.settings.history_bytes, self.settings.session_ttl,
                           data_home=lambda: str(xdg_data_home()),   # beside core's db
                           max_sessions_per_client=self.settings.max_sessions_per_client,
                           max_turn_records_per_client=self.settings.max_turn_records_per_client,
                           durable=self.settings.store_durable)
        if self.settings.health and store.shared:
            store = TimedStore(store, self.metrics)
        return store

    # ---- health (hub/health_server.py, docs/metrics.md) ----
    def _start_health(self) -> Optional[HealthServer]:
        """The health endpoint on its own thread, last, once everything it reports exists."""
        if not self.settings.health:
            return None
        return self.settings.serve_health(self.readiness, self.metrics)

    def readiness(self) -> Verdict:
        """`/readyz` (core/health.readiness): the store pinged now, the engine loaded (until
        shutdown), and not draining. Runs on the health server's thread."""
        draining = self.draining
        return readiness(store_answers=draining or self.store.ping(),
                         engine_loaded=self._serving and self.engine is not None,
                         draining=draining)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def begin_draining(self) -> None:
        """From now on `/readyz` says "draining" (503; 404 to `?not_ready=404`, what
        config/haproxy.cfg asks: docs/metrics.md), so the load balancer
        sends new satellites elsewhere. Turns already here are served as before; `drain()`
        does the rest."""
        self._draining.set()

    @property
    def serving(self) -> bool:
        """Not shut down yet."""
        return self._serving

    def drain(self) -> DrainReport:
        """Drain, then shut down (hub/draining.py: hivemind-core's SIGTERM ends here, on its
        main thread, before the process exits): not ready at once, idle satellites closed,
        turns arriving refused, the running ones finished (up to `drain_timeout`)."""
        LOG.info(f"draining: {len(self.open_turns)} turns running, up to "
                 f"{self.settings.drain_timeout:g} s")
        report = self.drainer.run(self.begin_draining)
        LOG.info(f"drained in {report.seconds:.2f} s: {report.finished} turns finished, "
                 f"{report.cut} cut at drain_timeout, {report.refused} refused, "
                 f"{report.closed} connections closed")
        self.shutdown()
        return report

    # ---- IO loop thread: keep it short ----
    def identify(self, message: Message, what: str) -> Optional[Sender]:
        """The authenticated satellite that sent `message`, or None (hub/senders.py). The hub
        secret is read (or created) on the first message, when the hub's XDG dirs are in
        place; from the shared store when there is one (ConversationStoreError while it is
        down)."""
        return identify(self.clients, self.store.secret, message, what)

    def _on_utterance(self, message: Message) -> None:
        try:
            sender = self.identify(message, "an utterance")
        except ConversationStoreError as e:
            self._fail_unnamed(message, str(e), EndReason.STORE_UNAVAILABLE)
            return
        except IdentifierTooLongError as e:
            self._fail_unnamed(message, str(e), EndReason.ID_TOO_LONG)
            return
        if sender is None:
            return
        turn_id = turn_id_of(message.context)
        refusal = id_refusal("turn id", turn_id)
        if refusal:
            self._fail_unnamed(message, refusal, EndReason.ID_TOO_LONG)
            return
        self.satellites.touch(sender.session_id, sender.client, sender.peer)
        self.satellites.keep_sweeping()
        self._queue(self._turn(message, sender, turn_id))

    def _turn(self, message: Message, sender: Sender, turn_id: str) -> HubTurn:
        """IO loop: the turn an utterance of `sender` is."""
        turn = HubTurn(self, message, sender.client, sender.peer, loop_here(self.own_loop),
                       first_utterance(message.data) or "", sender.satellite_session,
                       sender.session_id)
        turn.turn_id = turn_id
        turn.store_client = client_fingerprint(self.store.secret(),
                                               connection_client(sender.client))
        return turn

    def _queue(self, turn: HubTurn) -> None:
        """IO loop: the turn to the workers, under its rolling timeout; or its end now."""
        if not turn.utterance.strip():   # still a turn: it gets its end, never silence
            turn.finish(failed=True, why="the utterance has no text", reason=EndReason.NO_TEXT)
            return
        if not self.drainer.admit(turn.client):
            self._refuse_draining(turn)
            return
        def job() -> None:
            run_turn(self, turn)
        turn.job = job
        self.open_turns.add(turn)
        def begin_early() -> None:     # a free worker takes it now: overlap its round trip
            turn.sent_begin = self.store.send_begin(turn.session_id, turn.turn_id,
                                                    client=turn.store_client)
        try:
            self.executor.submit(turn.session_id, job, group=connection_client(turn.client),
                                 at_once=begin_early)
        except QueueFull as e:
            turn.finish(failed=True, why=f"hub busy ({e})", reason=EndReason.BUSY)
            return
        self._watch(turn)

    def _refuse_draining(self, turn: HubTurn) -> None:
        """IO loop: a turn that reached a draining replica is not run: it ends at once with
        the `draining` refusal, which our client sends to another replica (the turn id in its
        context says it is ours). A stock satellite, whose utterance carries no turn id and
        which would only hear "not understood", is told aloud first; its connection is then
        closed (it was idle) and it reconnects, elsewhere."""
        if not turn.turn_id:
            self.deliver(turn, turn.reply(SPEAK_TYPE, {
                "utterance": DRAINING_SPEECH, "expect_response": False, "lang": turn.lang,
                "meta": {"skill": PLUGIN_NAME}}))
        turn.finish(failed=True, why=DRAINING_WHY, reason=EndReason.DRAINING)
        self.drainer.refused()

    def _fail_unnamed(self, message: Message, why: str, reason: EndReason) -> None:
        """IO loop: an utterance whose engine session cannot be named (the store holding the
        hub secret is down, an id over its bound) still gets its end, with the reason; the
        one log line is the turn's (`why` is bounded)."""
        peer, sat_session = sender_of(message)
        turn = HubTurn(self, message, self.clients.get(peer), peer, loop_here(self.own_loop), "",
                       sat_session, "")
        turn.finish(failed=True, why=why, reason=reason)

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
            self.unqueue(turn)

    def unqueue(self, turn: HubTurn) -> None:
        """IO loop: a turn that ended (a timeout, a stop) leaves the executor's queue if its
        job never started; unless its begin went out to the store as it was queued: that job
        runs, reads the replies and gives up the record it claimed (hub/turn_runner.py), and
        a free worker was taking it up already."""
        if turn.sent_begin is None:
            self.executor.cancel(turn.session_id, turn.job)

    def _on_connection_closed(self, client) -> None:
        """IO loop, as the connection goes: its sessions, and its old names in core's table
        (hub/connections.close_connection)."""
        close_connection(self.clients, client)   # {} before hivemind-core binds the plugin
        self.satellites.closed(client)
        self.drainer.disconnected(client)

    def deliver(self, turn: HubTurn, reply: Message) -> None:
        """Hand a reply to the IO loop (the only thread that may write to a socket)."""
        turn.loop.add_callback(self.send, turn.client, turn.peer, reply)

    def send(self, client, peer: str, reply: Message) -> None:
        """IO loop: write `reply` to the connection `client` (hub/dialects.send_reply)."""
        send_reply(client, peer, reply)

    # ---- any thread ----
    def keep_exchange(self, ended: EndedExchange, strict: bool = False) -> None:
        """An ended turn or QUERY into the store (hub/exchanges.py), its history only while
        its session is followed; `strict`: a store failure raises."""
        keep_exchange(self.store, self.satellites.__contains__, ended, strict=strict)

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
        return answer_client_query(self, utterance, lang, client)

    def __repr__(self) -> str:
        # the dataclass repr would print config, i.e. a relay's upstream key and password, and
        # hivemind-core logs client objects (which reference this) at DEBUG
        return (f"ChatAgentProtocol(engine={self.settings.engine!r}, "
                f"workers={self.settings.workers}, timeout={self.settings.timeout:g})")

    def shutdown(self) -> None:
        self._serving = False
        if self.health is not None:      # its port and thread released first
            self.health.stop()
        self.asides.stop_all()
        self.executor.shutdown(wait=False)
        self.store.close()
        stop = getattr(self.engine, "shutdown", None)
        if callable(stop):
            stop()
        self.own_loop.close()

