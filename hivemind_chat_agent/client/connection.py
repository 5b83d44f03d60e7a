"""One authenticated, encrypted HiveMind connection: the thin I/O shell around `HubLink`.

The connection's protocol state (handshake of either generation, readiness, how it ended and
why) is core/hub_link.py's `HubLink`, which takes what the socket reports and returns what to
do. This shell owns the socket thread and the waits: it feeds `HubLink` what `Transport`
reports (`on_socket_*`), carries out each `Decision` (send, install the channel, end the
turns, close), and sets the events callers wait on. The turns it carries are
client/carried_turns.py's, the satellite's reports (audio end, mycroft.stop)
client/satellite_reports.py's, the words of each failure core/refusals.py's, and the
websocket client/transport.py's. Unlike hivemind-bus-client's own protocol it binds the
handshake before the socket thread starts (the hub's first HANDSHAKE is never missed), never
reconnects by itself (a refused key or a dead hub is one typed error), and writes replies into
no Session but their own.

Like a satellite, it reports `recognizer_loop:audio_output_end` for every sentence it receives
(at once: it has no speaker), because skills that speak with wait=True block until then; a
caller that plays the audio itself sets `plays_audio` and reports through the agent.
"""
import threading
import time
import uuid
from typing import Any, Callable, Optional

from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from ovos_utils.log import LOG
from websocket import WebSocketConnectionClosedException

from hivemind_chat_agent import background
from hivemind_chat_agent.client.carried_turns import CarriedTurns, TurnHandle, TurnSink
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.satellite_reports import SatelliteReports
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.client.transport import (
    connect_failure,
    exchange_inputs,
    garbled,
    open_transport,
    redact,
)
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.frames import Opened
from hivemind_chat_agent.core.hub_link import Decision, HubLink
from hivemind_chat_agent.core.protocol_names import POLICY_DENIED_TYPE, TURN_TAG_KEY
from hivemind_chat_agent.core.refusals import (
    UtteranceTopic,
    no_handshake_in_time,
    plan_denial,
    read_denial,
)
from hivemind_chat_agent.core.replies import ReplyKind, parse_reply
from hivemind_chat_agent.errors import ConnectionLostError, HiveMindChatError, HubUnreachableError

CLOSE_ACKNOWLEDGED_WITHIN = 2.0   # seconds a close waits for the hub's close (stock 4.0 hubs)


class HubConnection:
    """One websocket to the hub. On a 4.x hub it carries one session's turns (the hub binds the
    HELLO's Session to the connection); on a hub whose channel says it reads every message's
    Session (`many_sessions`, 5.x) the pool shares it between session_ids, each utterance
    declaring its own. Its turns (`CarriedTurns`) are keyed by session either way."""

    def __init__(self, config: ClientConfig, session: Optional[Session], book: SessionBook,
                 on_aside: Callable[[str, str], object] = lambda sid, text: None,
                 clock: Clock = background.SYSTEM_CLOCK,
                 topic: Optional[UtteranceTopic] = None,
                 on_speaker: Callable[[str], None] = lambda speaker: None,
                 on_turn_records: Callable[[], None] = lambda: None,
                 transport: Callable[..., Any] = open_transport):
        """`transport(owner, config, useragent)` makes the socket layer (tests pass one that
        records what would be sent)."""
        self.config = config
        self.session_id = session.session_id if session is not None else ""   # "": a spare
        self._book = book
        self._on_aside = on_aside   # a sentence spoken outside any turn (socket thread)
        self._on_speaker = on_speaker   # what answers on this hub, told once (socket thread)
        self._speaker_told = False
        self._on_turn_records = on_turn_records   # the hub keeps turn records (socket thread)
        # hivemind-core files connections under "useragent::client::name::session": two with
        # the same name and session (two processes, or a reconnect racing the old close) would
        # overwrite each other's entry, so every connection gets a name of its own.
        self.useragent = f"{config.useragent}-{uuid.uuid4().hex[:8]}"
        self._clock = clock
        self.link = HubLink(exchange_inputs(config), config.site_id or "",
                            book.wire(session) if session is not None else None)
        self._link_lock = threading.Lock()    # the socket thread and callers both feed it
        self.turns = CarriedTurns(book, clock, config.max_sessions)
        self._done = threading.Event()      # ready or closed, whichever first
        self._ended = threading.Event()     # closed (link.error says why, when it knows)
        self.topic = topic or UtteranceTopic(config.utterance_topic)
        # a stock 4.0 hub plugin forwards replies while the hub's client table changes: our
        # HELLO and close wait until the hub has acted on them (client/churn_gate.py)
        self.acknowledge_changes = False
        self._close_wait = 0.0      # how long the close under way waits for the hub's
        self._thread: Optional[threading.Thread] = None
        self._transport = transport(self, config, self.useragent)
        self.reports = SatelliteReports(
            emit=lambda message: self._transport.emit(HiveMessage(HiveMessageType.BUS,
                                                                  payload=message)),
            wire=self._book.wire, source=self.useragent, turn_open=self.turns.awaits_audio_end,
            usable=lambda: self.alive, clock=clock)

    # ---- what the link knows ----
    @property
    def generation(self) -> str:
        return self.link.generation

    @property
    def many_sessions(self) -> bool:
        return self.link.many_sessions

    @property
    def hub_spoke(self) -> bool:
        return self.link.hub_spoke

    @property
    def alive(self) -> bool:
        """Ready for turns: encrypted, its HELLO said, not closed."""
        return self._done.is_set() and self.link.ready

    @property
    def untagged(self) -> bool:
        """The hub dropped our turn tag from some reply."""
        return self.turns.untagged

    # ---- lifecycle (caller's thread) ----
    def connect(self) -> "HubConnection":
        """Open the socket and finish the handshake the hub offers, or raise a typed error."""
        self._thread = threading.Thread(target=self._transport.run_forever, daemon=True,
                                        name=f"hivemind-chat-{self.session_id}")
        background.start(self._thread)
        if not self._done.wait(self.config.connect_timeout):
            opened = self.link.was_opened
            self.close()
            raise no_handshake_in_time(opened, f"{self.config.url_host}:{self.config.port}",
                                       self.config.connect_timeout)
        if self.link.error is not None:
            self.close()
            raise self.link.error
        if self.link.is_closed:
            raise ConnectionLostError("the connection was closed while it was being opened")
        if self.session_id:       # its HELLO went out with the handshake
            self._until_hub_read_hello()
        return self

    def claim(self, session: Session) -> "HubConnection":
        """A spare (handshake done, no HELLO yet) becomes this session's connection. The HELLO
        binds the session on a 4.x hub and the utterance follows it on the same socket, so the
        hub reads them in that order; raises a typed error if the socket is gone."""
        with self._link_lock:
            hello = self.link.claim(self._book.wire(session))
        self.session_id = session.session_id
        self._send_or_say_why(hello)
        self._until_hub_read_hello()
        return self

    def _until_hub_read_hello(self) -> None:
        """A 4.x hub files the connection in its client table when it reads the HELLO; with
        `acknowledge_changes`, return only once it has (a ping answered after the HELLO), so
        no turn's traffic meets the table changing (at most connect_timeout)."""
        if not self.acknowledge_changes or self.link.many_sessions:
            return       # a 5.x hub's stock plugin iterates a copy of its table
        if not self._transport.hub_has_read(self.config.connect_timeout):
            if self.link.error is not None:      # refused right after the HELLO
                self.close()
                raise self.link.error
            LOG.debug("the hub did not answer a ping after our HELLO")

    def confirm(self, timeout: float) -> None:
        """Wait up to `timeout` for a fresh v3 connection's refusal and raise it. A 5.x hub
        checks our pinned key only after the last handshake message and says nothing when it
        is content; turns learn of a refusal as it comes, a warm-up waits for it."""
        if self.link.many_sessions and not self.link.hub_spoke:
            self._ended.wait(timeout)
        if self.link.error is not None:
            raise self.link.error

    def close(self) -> None:
        """Close the socket and end the socket thread; waiting turns end as LOST. With
        `acknowledge_changes`, an open connection first waits (at most CLOSE_ACKNOWLEDGED_WITHIN)
        for the hub's answering close: the hub has then taken it out of its client table."""
        if self.acknowledge_changes and self.alive and not self.link.many_sessions:
            self._close_wait = CLOSE_ACKNOWLEDGED_WITHIN
        self._feed(self.link.close)
        self._stop_transport()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        self._transport.release()

    def abort_connect(self, error: HiveMindChatError) -> None:
        """From another thread: end a connect() in progress now, raising `error` there."""
        self._feed(self.link.failed, error)

    # ---- turns (caller's thread) ----
    def start_turn(self, session: Session, utterance: str, tag: str, timeout: float,
                   sink: TurnSink) -> TurnHandle:
        """Send the utterance as a new turn of its session; its sentences go to `sink` as they
        arrive, its end to the returned handle (TurnHandle.wait_end)."""
        def check():
            if not self.alive:
                raise self.link.error or ConnectionLostError(
                    "the connection to the hub is closed; retry the turn")
        self.turns.wait_for_listener(session.session_id)
        handle = self.turns.open(session.session_id, tag, timeout, sink, check)
        try:
            return self._send_turn(handle, session, utterance, tag)
        except BaseException:
            self.finish_turn(handle)
            raise

    def _send_turn(self, handle: TurnHandle, session: Session, utterance: str,
                   tag: str) -> TurnHandle:
        wire = self._book.wire(session)
        data = {"utterances": [utterance]}
        if "lang" in wire:
            data["lang"] = wire["lang"]
        message = Message(self.topic.current, data,
                          {"session": wire, TURN_TAG_KEY: tag,
                           "source": self.useragent, "platform": self.config.useragent,
                           "destination": "HiveMind"})
        handle.message = message
        self._send_or_say_why(HiveMessage(HiveMessageType.BUS, payload=message))
        return handle   # a close from now on reaches the turn as LOST

    def _send_or_say_why(self, message: HiveMessage) -> None:
        """Send from the caller's thread; if that fails because the hub refused us, raise the
        refusal. The transport drops the channel before the socket thread reads the hub's
        close, and a 5.x hub refusing our pinned key right after the handshake lands in
        between: wait (at most 1 s) for the socket thread to say why."""
        try:
            self._transport.emit(message)
        except HiveMindChatError:
            self._ended.wait(1.0)
            if self.link.error is not None:
                raise self.link.error from None
            raise

    def expire(self, handle: TurnHandle) -> None:
        self.turns.expire(handle)

    def abort(self, handle: TurnHandle, reason: str) -> None:
        self.turns.abort(handle, reason)

    def stop_answer(self, handle: TurnHandle) -> None:
        """Barge-in: ask the hub to stop this session's answer the way OVOS does; a skill's
        answer reaches the turn's sink (`hub_stopped`). Best effort: the caller ends the turn
        here whatever the hub does."""
        if not handle.turn.state.is_final:
            self.reports.stop(handle.turn.session_id, handle.turn.tag, handle.sink.hub_stopped)

    def finish_turn(self, handle: TurnHandle, stopped: bool = False) -> None:
        self.turns.finish(handle, stopped)

    def report_audio_end(self, tag: Optional[str] = None,
                         session_id: Optional[str] = None) -> None:
        self.reports.audio_end(session_id or self.session_id, tag)

    # ---- what Transport reports (socket thread) ----
    def on_socket_open(self) -> None:
        self._feed(self.link.opened)

    def on_socket_message(self, message: HiveMessage) -> None:
        self._feed(self.link.frame_received, message)

    def on_socket_untrusted(self, opened: Opened) -> None:
        """A frame we must not read past: the stream can no longer be trusted, close it."""
        self._feed(self.link.untrusted, opened, self.config.max_frame_bytes)

    def on_socket_error(self, error: Any) -> None:
        if isinstance(error, HiveMindChatError):   # the transport knew why (a pinned
            self._feed(self.link.failed, error)     # certificate, an MQTT hub's silence)
            return
        if isinstance(error, WebSocketConnectionClosedException) and self.link.was_opened:
            return   # the hub's close frame: on_socket_close follows with its code and reason
        if not self.link.was_opened:
            self._feed(self.link.failed, connect_failure(
                error, self.config, lambda text: redact(text, self.config, self.useragent)))
        elif not self.link.ready and garbled(error):
            self._feed(self.link.failed, HubUnreachableError(
                f"the connection to the hub broke during the handshake ({type(error).__name__}); "
                "the key was not refused: check the network path to the hub and its log"))
        else:
            self._feed(self.link.closed, None, "",
                       error if self.link.ready and garbled(error) else None)

    def on_socket_close(self, code: Any, reason: str) -> None:
        self._feed(self.link.closed, code, reason)

    def on_session_reset(self, reason: str) -> None:
        """MQTT: the hub's session of our key ended unannounced; turns it never read are
        sent again on a new connection (turn_driver)."""
        self._feed(self.link.session_reset, reason)

    # ---- carrying out what the link decided ----
    def _feed(self, link_input: Callable[..., Decision], *args: Any) -> None:
        with self._link_lock:
            decision = link_input(*args)
        self._carry_out(decision)

    def _carry_out(self, decision: Decision) -> None:
        try:
            for message in decision.send:
                self._transport.emit(message)
            if decision.channel is not None:
                self._transport.channel = decision.channel
                for message in decision.then_send:
                    self._transport.emit(message)
        except HiveMindChatError as e:
            self._feed(self.link.failed, e)
            return
        if decision.bus is not None:
            self._on_bus(decision.bus)
        if self.link.is_closed:
            self._ended.set()
        if self.link.is_closed or self.link.ready:
            self._done.set()
        if decision.refuse_turns is not None:
            self.turns.refuse(None, decision.refuse_turns)
        if decision.lose_turns is not None:
            reason, kind = decision.lose_turns
            if kind:
                LOG.warning(f"closing the connection to the hub: {reason}")
            self.turns.lose_all(reason, kind, decision.unsent)
        if decision.close or decision.failed is not None:
            self._stop_transport()

    def _stop_transport(self) -> None:
        wait, self._close_wait = self._close_wait, 0.0
        if wait:
            self._transport.stop(wait_for_hub=wait)
        else:
            self._transport.stop()

    def _on_bus(self, payload: Any) -> None:
        if getattr(payload, "msg_type", None) == POLICY_DENIED_TYPE:
            self._on_denied(payload.data)
            return
        try:
            reply, why = parse_reply(payload.msg_type, payload.data, payload.context)
        except Exception as e:
            reply, why = None, f"unreadable payload ({type(e).__name__})"
        if reply is None:
            LOG.debug(f"ignoring reply: {why}")
            return
        reply, routing, unshare = self.turns.route(reply, self.session_id,
                                                   self.link.many_sessions)
        if unshare:
            self.link.unshare()
        if reply is None:
            return
        if routing is None:
            self.reports.stopped(reply.turn_tag, reply.skill_id)
            return
        if routing.ignored:
            LOG.debug(f"ignoring reply: {routing.ignored}")
        if reply.turn_records:
            self._on_turn_records()
        if reply.kind is ReplyKind.SPEAK and reply.speaker and not self._speaker_told:
            self._speaker_told = True
            self._on_speaker(reply.speaker)
        if reply.kind is ReplyKind.SPEAK and not self.config.plays_audio:
            if routing.events:
                time.sleep(0)   # let the woken caller take the sentence before we encrypt
            self.reports.audio_end(reply.session_id, reply.turn_tag)
            self.reports.echo_later(reply.session_id, reply.turn_tag)
        if routing.aside is not None:
            self._on_aside(reply.session_id, routing.aside)

    def _on_denied(self, data: Any) -> None:
        """`hive.policy.denied`: core/refusals.plan_denial decides what it means for the turns
        that got nothing back yet."""
        denied, code, reason, extra = read_denial(data)
        if denied is None:   # no type named: it answers none of ours
            LOG.info(f"the hub denied a message it did not name ({code}): {reason}")
            return
        if self.reports.refused(denied):   # an audio end or a stop, not an utterance
            return
        waiting = self.turns.unanswered(denied)
        plan = plan_denial(denied, code, reason, extra, len(waiting), self.topic)
        if plan.note:
            (LOG.warning if plan.loud else LOG.info)(plan.note)
        if plan.refuse is not None:
            self.turns.refuse(waiting, plan.refuse)
        for handle in waiting if plan.retry else ():
            if handle.message is None:   # unanswered() names only turns that sent one
                continue
            handle.message.msg_type = plan.retry
            try:
                self._transport.emit(HiveMessage(HiveMessageType.BUS, payload=handle.message))
            except HiveMindChatError as e:
                self.turns.refuse([handle], e)
