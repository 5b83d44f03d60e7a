"""`OVOSModeProtocol`: `hivemind-chat-agent-plugin` with `"mode": "ovos"`, serving every
satellite of the hub from the local ovos-core messagebus, as hivemind-ovos-agent-plugin does,
without its races (docs/compatibility.md).

The decisions are core/ovos_routes.OvosRoutes' (what goes to the bus under which Session, what
goes back to which satellite, bounds, fairness); this shell carries them out on the right
thread, one lock around the table:

- hivemind-core's IO loop hands every satellite message to `bus.emit` (`SatelliteInbox`): the
  sender is identified (hub/senders.identify: authenticated, ids bounded, its session namespaced
  with the access key and the hub's secret) and the message queued; a refused utterance is
  answered there and then with the chat mode's failure shape;
- one sender thread writes the queues to the bus, round robin between clients, so neither a
  flooding satellite nor a stalled bus socket ever holds up the IO loop;
- the bus thread (hub/ovos_bus.py) routes what OVOS sends and hands each delivery to the loop
  of the connection it is for with `add_callback`: every frame to a satellite is written
  there, to the connection object that sent (by hub/dialects.py, as the chat mode writes),
  never by iterating hivemind-core's client table. A connection's loop is the one running on
  the thread its first message came in on (the websocket transport's IO loop, both
  generations), or the plugin's own where that thread runs none (hivemind-mqtt-protocol's,
  hivescope's): hub/reply_loops.py;
- a bus that goes down fails every utterance queued or in flight (the satellite is told, with
  reason `backend_unavailable`), refuses new ones at once, and reconnects by itself;
- hivemind-core's QUERY / CASCADE are answered by OVOS through the same bus connection, under
  a query-scoped Session (hub/ovos_query.py), as the stock plugin answers them.
"""
import dataclasses
import json
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from hivemind_plugin_manager.protocols import AgentProtocol, ClientCallbacks
from ovos_bus_client.message import Message
from ovos_utils.log import LOG

from hivemind_chat_agent import compat
from hivemind_chat_agent.core.limits import shown, shown_name
from hivemind_chat_agent.core.loop_share import REFUSAL_PAUSE
from hivemind_chat_agent.core.ovos_probation import Probation
from hivemind_chat_agent.core.ovos_replies import failure_replies
from hivemind_chat_agent.core.ovos_route_terms import Outbound, Refusal, Satellite
from hivemind_chat_agent.core.ovos_routes import OvosRoutes
from hivemind_chat_agent.core.protocol_names import UTTERANCE_TYPES
from hivemind_chat_agent.core.skills_readiness import ANSWER_TYPE, NOT_READY_WHY, SkillsReadiness
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import IdentifierTooLongError
from hivemind_chat_agent.hub.agent_bus import SatelliteInbox
from hivemind_chat_agent.hub.connections import (
    close_connection,
    connection_client,
    connection_token,
)
from hivemind_chat_agent.hub.dialects import install_dialects, send_reply
from hivemind_chat_agent.hub.draining import DrainReport, drain_at_exit
from hivemind_chat_agent.hub.ovos_bus import BusNotConnected, OvosBus
from hivemind_chat_agent.hub.ovos_operations import OvosOperations, draining_replies
from hivemind_chat_agent.hub.ovos_query import QUERY_ID_MARKERS, OvosQueries, query_session
from hivemind_chat_agent.hub.ovos_settings import OvosModeSettings
from hivemind_chat_agent.hub.refusal_log import warn_refusal
from hivemind_chat_agent.hub.reply_loops import OwnLoop, ReplyLoop, loop_here
from hivemind_chat_agent.hub.senders import identify, sender_of

__all__ = ["OVOSModeProtocol", "SatelliteInbox"]

CORE_NOTICE_PREFIX = "hive."
LOOP_ATTRIBUTE = "_hivemind_chat_reply_loop"   # set on hivemind-core's connection object
ANSWER_MARKERS = (f'"{ANSWER_TYPE}"'.encode(), f'"{ANSWER_TYPE}"')   # bytes, str frames
LOST_WHY = "the hub lost its OVOS messagebus before the utterance was handled"


class OVOSModeProtocol(AgentProtocol):
    """hivemind-core agent protocol plugin `hivemind-chat-agent-plugin`, OVOS mode."""

    def __init__(self, config: Optional[Dict[str, Any]] = None, bus=None, hm_protocol=None,
                 callbacks: Optional[ClientCallbacks] = None, bus_factory=OvosBus,
                 now=time.monotonic):
        callbacks = dataclasses.replace(callbacks or ClientCallbacks())   # not the caller's
        core_on_connect, core_on_disconnect = callbacks.on_connect, callbacks.on_disconnect

        def on_connect(client: Any) -> None:
            self.operations.drainer.connected(client, loop_here(self.own_loop))
            core_on_connect(client)

        def on_disconnect(client: Any) -> None:
            self._on_connection_closed(client)
            core_on_disconnect(client)
        callbacks.on_connect, callbacks.on_disconnect = on_connect, on_disconnect
        super().__init__(config=dict(config or {}), bus=bus or SatelliteInbox(self._inbound),
                         hm_protocol=hm_protocol, callbacks=callbacks)
        self.settings = OvosModeSettings.from_dict(self.config)
        self._table = threading.Condition()       # guards `routes`
        self.own_loop = OwnLoop("hivemind-chat-ovos-replies")   # for loop-less transports
        # health, metrics, the drain on SIGTERM: hub/ovos_operations.py
        self.operations = OvosOperations(self.settings, lambda: self.clients,
                                         lambda: self.own_loop.get(), self._utterances,
                                         lambda: len(self.routes))
        self.routes = OvosRoutes(self.settings.limits, now, metrics=(
            self.operations.metrics if self.settings.health else None),
            probation=Probation(*self.settings.probation))
        self.now = now
        self.readiness = SkillsReadiness()      # ovos-core's skills, asked after each connect
        self._secret: Optional[bytes] = None
        self._closing = False
        install_dialects()
        compat.for_hub(self.settings.loop_pacing)
        self.ovos = bus_factory(self.settings.bus, self._from_ovos, self._bus_up,
                                self._bus_down, retry=self.settings.bus_retry,
                                max_retry=self.settings.bus_max_retry)
        self.queries = OvosQueries(self.ovos.send, timeout=self.settings.query_timeout,
                                   total=self.settings.limits.in_flight_timeout,
                                   max_queries=self.settings.max_queries)
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name="hivemind-chat-ovos-sender")
        self._sender.start()
        self.ovos.start()
        if not self.ovos.connected.wait(self.settings.connect_wait):
            LOG.warning(f"the OVOS messagebus at {self.settings.bus} is not answering yet; "
                        "retrying in the background, satellites' utterances are refused "
                        "meanwhile (is ovos-messagebus running?)")
        self.operations.start_health(self._ovos_state)
        drain_at_exit(self)

    # ---- operations (hub/ovos_operations.py): each reads the table under its lock ----
    def _utterances(self) -> Dict[str, int]:
        with self._table:
            return self.routes.utterances_by_connection()

    def _ovos_state(self) -> Tuple[bool, str]:
        with self._table:
            return self.routes.bus_up, self.routes.down_why

    @property
    def serving(self) -> bool:
        return self.operations.serving

    def drain(self) -> DrainReport:
        """Drain, then shut down (hub/ovos_operations.py)."""
        return self.operations.drain(self.shutdown)

    # ---- IO loop: satellites' messages ----
    def _hub_secret(self) -> bytes:
        if self._secret is None:
            from ovos_utils.xdg_utils import xdg_data_home

            from hivemind_chat_agent.hub.secret import hub_secret
            self._secret = hub_secret(str(xdg_data_home()))   # beside core's database
        return self._secret

    def _inbound(self, message: Message) -> None:
        """IO loop: a satellite's message (anything hivemind-core hands the agent) to the
        queues, or, for an utterance refused, its failure now."""
        if message.msg_type.startswith(CORE_NOTICE_PREFIX):
            return     # hivemind-core's own notices (hive.client.connect ...): not OVOS's
        what = f"a {shown(message.msg_type)} message"
        try:
            sender = identify(self.clients, self._hub_secret, message, what)
        except IdentifierTooLongError as e:
            self._refuse_unnamed(message, Refusal(EndReason.ID_TOO_LONG, str(e)))
            return
        if sender is None:
            return
        self._note_loop(sender.client)
        satellite = Satellite(connection_token(sender.client), connection_client(sender.client),
                              sender.peer, sender.satellite_session["session_id"],
                              sender.session_id, sender.client)
        wire = {"type": message.msg_type, "data": message.data,
                "context": dict(message.context, session=sender.satellite_session)}
        if self.operations.draining and message.msg_type in UTTERANCE_TYPES:
            self._refuse_draining(Outbound(wire, satellite, True))
            return
        with self._table:
            refusal = self.routes.accept(satellite, wire)
            if refusal is None:
                self._table.notify()
        if refusal is not None:
            if refusal.reason is EndReason.BUSY:     # its excess read (and refused) slower
                compat.hold_reads(sender.client, REFUSAL_PAUSE)
            self._refuse(Outbound(wire, satellite, message.msg_type in UTTERANCE_TYPES),
                         refusal)

    def _note_loop(self, client) -> None:
        """Transport thread: the loop this connection's frames will be written on, kept on
        the connection object itself (it goes when the connection goes), set once: a
        connection's messages all come in on its transport's thread."""
        if getattr(client, LOOP_ATTRIBUTE, None) is None:
            compat.mqtt_writes_on_its_thread(client)   # paho's writes on one thread (MQTT)
            try:
                setattr(client, LOOP_ATTRIBUTE, loop_here(self.own_loop))
            except AttributeError:      # a connection type that takes no attributes
                pass

    def _refuse(self, outbound: Outbound, refusal: Refusal) -> None:
        """An utterance refused or lost gets its failure (other messages: a log line)."""
        if not outbound.is_utterance:
            LOG.info(f"not forwarding {shown(outbound.message.get('type'))} from "
                     f"{shown_name(outbound.sender.peer)}: {refusal.why}")
            return
        warn_refusal("failure", outbound.sender.peer,
                     f"answering {shown_name(outbound.sender.peer)} with a failure: "
                     f"{refusal.why}")
        self._to_loop(outbound.sender.handle, outbound.sender.peer,
                      failure_replies(outbound, refusal))
        self.operations.refused(refusal.reason)

    def _refuse_draining(self, outbound: Outbound) -> None:
        """IO loop: an utterance that reached a draining hub is not sent to OVOS
        (hub/ovos_operations.draining_replies says what it hears instead)."""
        self._to_loop(outbound.sender.handle, outbound.sender.peer, draining_replies(outbound))
        self.operations.refused(EndReason.DRAINING)

    def _refuse_unnamed(self, message: Message, refusal: Refusal) -> None:
        if message.msg_type not in UTTERANCE_TYPES:
            LOG.info(f"not forwarding {shown(message.msg_type)}: {refusal.why}")
            return
        peer, session = sender_of(message)    # answered under the Session as it came
        satellite = Satellite("", "", peer, str(session.get("session_id") or ""), "",
                              self.clients.get(peer))
        if satellite.handle is not None:
            self._note_loop(satellite.handle)
        wire = {"type": message.msg_type, "data": {},
                "context": dict(message.context, session=session)}
        warn_refusal("failure", peer,
                     f"answering {shown_name(peer)} with a failure: {refusal.why}")
        self._to_loop(satellite.handle, peer,
                      failure_replies(Outbound(wire, satellite, True), refusal))
        self.operations.refused(refusal.reason)

    def _on_connection_closed(self, client) -> None:
        """IO loop, as a connection goes: nothing more is written to it, and (as the chat
        mode does) its old names in hivemind-core 4.0's table go with it."""
        close_connection(self.clients, client)
        with self._table:
            self.routes.closed(connection_token(client))
        self.operations.drainer.disconnected(client)
        self.operations.drainer.recount()

    # ---- the sender thread: queues to the bus, and the skills' readiness probes ----
    def _next_work(self) -> Any:
        """Sender thread: the next thing to write (a readiness probe as a dict, or an
        Outbound), waiting for one; None once closing."""
        with self._table:
            while not self._closing:
                now = self.now()
                if self.readiness.overdue(now):
                    LOG.warning(f"ovos-core's skills have not answered on {self.settings.bus} "
                                f"for {self.readiness.warn_after:.0f} s; utterances are "
                                "refused until they do (is ovos-core running? A bus with no "
                                'ovos-core skill manager on it needs "wait_for_skills": '
                                "false)")
                probe = self.readiness.probe_due(now)
                if probe is not None:
                    return probe
                if self.routes.bus_up and self.routes.has_outbound():
                    return self.routes.next_outbound()
                wait = self.readiness.seconds_to_next_probe(now)
                self._table.wait(1.0 if wait is None else min(1.0, max(wait, 0.01)))
        return None

    def _send_loop(self) -> None:
        while True:
            outbound = self._next_work()
            if outbound is None:
                return
            if isinstance(outbound, dict):     # a probe: an unanswered one is sent again
                try:
                    self.ovos.send(json.dumps(outbound))
                except BusNotConnected:
                    pass
                continue
            try:
                self.ovos.send(json.dumps(outbound.message))
                continue
            except (BusNotConnected, TypeError, ValueError) as e:
                LOG.debug(f"not written to the OVOS bus: {type(e).__name__}")
            with self._table:
                tell = self.routes.unsent(outbound)
            if tell:
                self._refuse(outbound, Refusal(EndReason.BACKEND_UNAVAILABLE, LOST_WHY))
            self.operations.drainer.recount()

    # ---- the bus thread ----
    def _bus_up(self) -> None:
        LOG.info(f"connected to the OVOS messagebus at {self.settings.bus}")
        with self._table:
            if self.settings.wait_for_skills:
                self.readiness.bus_up(self.now())
                self.routes.skills_not_ready(NOT_READY_WHY)
            else:
                self.routes.bus_connected()
            self._table.notify()

    def _skills_answered(self, text) -> bool:
        """Bus thread: whether `text` was the skills' answer to a readiness probe (then
        utterances are taken from now on)."""
        try:
            message = json.loads(text)
        except ValueError:
            return False
        with self._table:
            ready = isinstance(message, dict) and self.readiness.answered(message)
            if ready:
                self.routes.bus_connected()
                self._table.notify()
        if ready:
            LOG.info(f"ovos-core's skills are ready on {self.settings.bus}")
        return ready

    def _bus_down(self) -> None:
        with self._table:
            self.readiness.bus_down()
            lost = self.routes.bus_lost()
        for outbound in lost:
            self._refuse(outbound, Refusal(EndReason.BACKEND_UNAVAILABLE, LOST_WHY))
        self.operations.drainer.recount()

    def _from_ovos(self, text) -> None:
        """Bus thread: a bus message to the satellites it names, handed to the IO loop. The
        frame comes as bytes (hub/ovos_bus.py skips websocket-client's UTF-8 pass; the JSON
        parser checks it anyway)."""
        if self.readiness.probing and ANSWER_MARKERS[isinstance(text, str)] in text and \
                self._skills_answered(text):
            return
        marker = b'"destination"' if isinstance(text, bytes) else '"destination"'
        query = self.queries.pending() and QUERY_ID_MARKERS[isinstance(text, str)] in text
        if not query and marker not in text:
            return          # most bus traffic names no destination: not parsed
        try:
            message = json.loads(text)
        except ValueError:      # UnicodeDecodeError is one
            return
        if not isinstance(message, dict) or (query and self.queries.deliver(message)):
            return
        with self._table:
            deliveries = self.routes.route(message)
        for delivery in deliveries:
            self._to_loop(delivery.handle, delivery.peer, [delivery.message])
        self.operations.drainer.recount()     # a `handled` may have ended the last utterance

    # ---- the IO loop writes ----
    def _to_loop(self, client, peer: str, messages: List[Dict[str, Any]]) -> None:
        """Any thread: `messages` to be written to `client` on its loop (`_note_loop`); the
        plugin's own loop for a connection that never sent (a refusal of an unnamed sender
        found in the client table), which 5.x connections allow from any thread."""
        if client is None:
            return
        loop: ReplyLoop = getattr(client, LOOP_ATTRIBUTE, None) or self.own_loop.get()
        loop.add_callback(self._write, client, peer, messages)

    def _write(self, client, peer: str, messages: List[Dict[str, Any]]) -> None:
        """IO loop: write each message to the connection `client`, as the chat mode writes
        (hub/dialects.send_reply); one to a connection gone is an INFO line: OVOS speaks to
        sessions whose satellite left, as a matter of course."""
        for wire in messages:
            send_reply(client, peer, Message(wire["type"], wire.get("data") or {},
                                             wire.get("context") or {}), not_sent=LOG.info)

    # ---- hivemind-core's other entry points ----
    def get_bus(self, client=None):
        """Always the inbox: an unreachable OVOS bus is this plugin's to answer (typed
        failures), not hivemind-core's BACKEND_UNAVAILABLE."""
        return self.bus

    def natural_language_query(self, utterance: str, lang: str) -> Iterator[Optional[str]]:
        """QUERY / CASCADE without a caller: OVOS's answer (hub/ovos_query.py), no policy."""
        return self.answer_query(utterance, lang, None)

    def answer_query(self, utterance: str, lang: str, client=None) -> Iterator[Optional[str]]:
        """QUERY / CASCADE from `client` (hivemind-core's worker thread): the sentences OVOS
        speaks for `utterance` under a query-scoped Session, as the client's policy has it,
        then None; None at once (a decline) when the policy denies it, the bus is down or
        too many answers are in progress."""
        if not isinstance(utterance, str) or not utterance.strip() or \
                len(utterance) > self.settings.max_query_chars:
            yield None
            return
        lang = lang if isinstance(lang, str) and 0 < len(lang) <= 32 else "en-US"
        session = query_session(self.hm_protocol, client, utterance, lang)
        if session is None:
            yield None
            return
        yield from self.queries.stream(utterance, lang, session)

    def __repr__(self) -> str:
        return f"OVOSModeProtocol(bus={self.settings.bus!r})"

    def shutdown(self) -> None:
        self.operations.stop()
        with self._table:
            self._closing = True
            self._table.notify_all()
        self.ovos.close()
        self.own_loop.close()

