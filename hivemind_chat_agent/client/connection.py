"""One authenticated, encrypted HiveMind connection: the thin I/O shell around its turns.

hivemind-bus-client's `HiveMessageBusClient` still moves the frames (websocket, ciphers,
encodings), but this module owns what its stock protocol gets wrong for a chat client
(field notes):

* the password handshake is bound before the socket thread starts, so the hub's first HANDSHAKE
  can never be missed (the library's 5 s stall);
* cipher preference is computed once per process, not by `cpuinfo` on every connect (1.1 s);
* no automatic reconnect: a refused key, a wrong password or a dead hub is reported once, as a
  typed error, and the next turn decides whether to reconnect;
* replies are not written into `SessionManager` for whatever session they name: they go through
  `parse_reply` and `CarriedTurns.route` (client/carried_turns.py), and only the reply's own
  session is refreshed;
* nothing but the handshake is ever sent before the session key exists.

Like a satellite, it reports `recognizer_loop:audio_output_end` for every sentence it receives
(at once: it has no speaker), because skills that speak with wait=True block until then; a
caller that plays the audio itself sets `plays_audio` and reports through the agent. Those
reports and the barge-in stop are client/satellite_reports.py's; the words of each failure are
core/refusals.py's, and the websocket is client/transport.py's.
"""
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional, Tuple

from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from ovos_utils.log import LOG
from websocket import WebSocketConnectionClosedException

from hivemind_chat_agent import background
from hivemind_chat_agent.client.carried_turns import CarriedTurns, TurnHandle
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.satellite_reports import SatelliteReports
from hivemind_chat_agent.client.transport import (connect_failure, exchange_inputs, garbled,
                                                  open_transport, redact)
from hivemind_chat_agent.core.frames import Opened
from hivemind_chat_agent.core.handshake import KeyExchange, choose
from hivemind_chat_agent.core.protocol_names import POLICY_DENIED_TYPE, TURN_TAG_KEY
from hivemind_chat_agent.core.refusals import (UtteranceTopic,
                                               closed_before_ready, no_handshake_in_time,
                                               plan_denial, read_denial,
                                               refusal_after_noise_handshake,
                                               refusal_from_close, untrusted_frame)
from hivemind_chat_agent.core.replies import ReplyKind, parse_reply
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.errors import ConnectionLostError, HiveMindChatError, HubUnreachableError


class HubConnection:
    """One websocket to the hub. On a 4.x hub it carries one session's turns (the hub binds the
    HELLO's Session to the connection); on a hub whose channel says it reads every message's
    Session (`many_sessions`, 5.x) the pool shares it between session_ids, each utterance
    declaring its own. Its turns (`CarriedTurns`) are keyed by session either way."""

    def __init__(self, config: ClientConfig, session: Optional[Session], book: SessionBook,
                 on_aside: Callable[[str, str], None] = lambda sid, text: None,
                 clock: Callable[[], float] = time.monotonic,
                 topic: Optional[UtteranceTopic] = None,
                 on_speaker: Callable[[str], None] = lambda speaker: None):
        self.config = config
        self.session_id = session.session_id if session is not None else ""   # "": a spare
        self._book = book
        self._on_aside = on_aside   # a sentence spoken outside any turn (socket thread)
        self._on_speaker = on_speaker   # what answers on this hub, told once (socket thread)
        self._speaker_told = False
        # hivemind-core files connections under "useragent::client::name::session": two with
        # the same name and session (two processes, or a reconnect racing the old close) would
        # overwrite each other's entry, so every connection gets a name of its own.
        self.useragent = f"{config.useragent}-{uuid.uuid4().hex[:8]}"
        self._hello_session = book.wire(session) if session is not None else None
        self._clock = clock
        self.turns = CarriedTurns(book, clock, config.max_sessions)
        self._ready = threading.Event()
        self._done = threading.Event()      # ready or failed, whichever first
        self._ended = threading.Event()     # closed, by us or the hub (a refusal is in _error
                                            # first, so whoever wakes on it can say why)
        self._error: Optional[HiveMindChatError] = None
        self._opened = False
        self._hello: Optional[Dict[str, Any]] = None      # the hub's cleartext HELLO
        self._exchange: Optional[KeyExchange] = None
        self.generation = ""                # which handshake the hub spoke, once it has
        self.many_sessions = False          # the hub reads each message's Session
        self.topic = topic or UtteranceTopic(config.utterance_topic)
        self.heard = False                  # some message arrived since the handshake
        self.retired = False                # the pool gives it no new turns
        self._thread: Optional[threading.Thread] = None
        self.last_used = clock()
        self.leases = 0                     # turns holding this connection (the pool's lock)
        self._transport = open_transport(self, config, self.useragent,
                                         self.session_id or self.useragent)
        self.reports = SatelliteReports(
            emit=lambda message: self._transport.emit(HiveMessage(HiveMessageType.BUS,
                                                                  payload=message)),
            wire=self._book.wire, source=self.useragent, turn_open=self.turns.is_open,
            usable=lambda: self._ready.is_set() and not self._closed)

    # ---- lifecycle (caller's thread) ----
    def connect(self) -> "HubConnection":
        """Open the socket and finish the handshake the hub offers, or raise a typed error."""
        self._thread = threading.Thread(target=self._transport.run_forever, daemon=True,
                                        name=f"hivemind-chat-{self.session_id}")
        background.start(self._thread)
        if not self._done.wait(self.config.connect_timeout):
            opened = self._opened
            self.close()
            raise no_handshake_in_time(opened, f"{self.config.url_host}:{self.config.port}",
                                       self.config.connect_timeout)
        if self._error is not None:
            self.close()
            raise self._error
        if self._closed:
            raise ConnectionLostError("the connection was closed while it was being opened")
        return self

    def claim(self, session: Session) -> "HubConnection":
        """A spare (handshake done, no HELLO yet) becomes this session's connection. The HELLO
        binds the session on a 4.x hub and the utterance follows it on the same socket, so the
        hub reads them in that order; raises a typed error if the socket is gone."""
        if self._hello_session is not None:
            raise RuntimeError("this connection already belongs to a session")
        self.session_id = session.session_id
        self._hello_session = self._book.wire(session)
        self._send_or_say_why(self._hello_message())
        return self

    def confirm(self, timeout: float) -> None:
        """Wait up to `timeout` for a fresh v3 connection's refusal and raise it. A 5.x hub
        checks our pinned key only after the last handshake message and says nothing when it
        is content; turns learn of a refusal as it comes, a warm-up waits for it."""
        if self.many_sessions and not self.heard:
            self._ended.wait(timeout)
        if self._error is not None:
            raise self._error

    @property
    def untagged(self) -> bool:
        """The hub dropped our turn tag from some reply."""
        return self.turns.untagged

    @property
    def _closed(self) -> bool:
        return self._ended.is_set()

    @property
    def alive(self) -> bool:
        return self._ready.is_set() and not self._closed

    def close(self) -> None:
        """Close the socket and end the socket thread; waiting turns end as LOST."""
        self._ended.set()
        self._transport.stop()
        self._fail_turns("the connection was closed")
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        self._transport.release()

    def abort_connect(self, error: HiveMindChatError) -> None:
        """From another thread: end a connect() in progress now, raising `error` there."""
        self._fail(error)

    # ---- turns (caller's thread) ----
    def start_turn(self, session: Session, utterance: str, tag: str,
                   timeout: float) -> TurnHandle:
        def check():
            if not self.alive:
                raise self._error or ConnectionLostError(
                    "the connection to the hub is closed; retry the turn")
        handle = self.turns.open(session.session_id, tag, timeout, check)
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
        self.last_used = self._clock()
        self._send_or_say_why(HiveMessage(HiveMessageType.BUS, payload=message))
        return handle   # a close from now on reaches the turn as LOST (_fail_turns)

    def _send_or_say_why(self, message: HiveMessage) -> None:
        """Send from the caller's thread; if that fails because the hub refused us, raise the
        refusal. The transport drops the channel before the socket thread reads the hub's
        close, and a 5.x hub refusing our pinned key right after the handshake lands in
        between: wait (at most 1 s) for the socket thread to say why."""
        try:
            self._transport.emit(message)
        except HiveMindChatError:
            self._ended.wait(1.0)
            if self._error is not None:
                raise self._error from None
            raise

    def expire(self, handle: TurnHandle) -> None:
        self.turns.expire(handle)

    def abort(self, handle: TurnHandle, reason: str) -> None:
        self.turns.abort(handle, reason)

    def stop_answer(self, handle: TurnHandle,
                    on_stopped: Callable[[str], None] = lambda skill: None) -> None:
        """Barge-in: ask the hub to stop this session's answer the way OVOS does. Best
        effort: the caller ends the turn here whatever the hub does."""
        if not handle.turn.state.is_final:
            self.reports.stop(handle.turn.session_id, handle.turn.tag, on_stopped)

    def finish_turn(self, handle: TurnHandle, stopped: bool = False) -> None:
        self.turns.finish(handle, stopped)
        self.last_used = self._clock()

    # ---- socket thread ----
    def _on_open(self):
        self._opened = True

    def _on_hive_message(self, message: HiveMessage):
        if self._transport.channel is not None:
            self.heard = True
        if message.msg_type == HiveMessageType.BUS:
            self._on_bus(message.payload)
        elif message.msg_type == HiveMessageType.HANDSHAKE:
            self._on_handshake(message.payload)
        elif message.msg_type == HiveMessageType.HELLO:
            if self._hello is None and isinstance(message.payload, dict):
                self._hello = dict(message.payload)   # the Noise prologue binds it
        else:
            LOG.debug(f"ignoring hive message of type {message.msg_type}")

    def _on_handshake(self, payload: Any):
        """The hub's offer picks the exchange (core/handshake.choose); its answers step it."""
        if not isinstance(payload, dict) or self._ready.is_set() or self._closed:
            return
        try:
            if self._exchange is None:
                if "envelope" in payload or "msg" in (payload.get("noise") or {}):
                    return          # an answer to a handshake we never started
                self._exchange = choose(self._hello or {}, payload, exchange_inputs(self.config))
                self._transport.emit(self._exchange.first())
                return
            send, channel = self._exchange.receive(payload)
            for message in send:
                self._transport.emit(message)
        except HiveMindChatError as e:
            self._fail(e)
            return
        except Exception as e:   # our side: an unwritable key dir, a corrupt key file …
            self._fail(HiveMindChatError(
                f"could not take part in the hub's handshake ({type(e).__name__}: {e}); for "
                f"the Noise handshake, check that noise_key_dir ({self.config.noise_key_dir}) "
                "is a writable directory of this user's"))
            return
        if channel is None:
            return
        self.generation = self._exchange.generation
        self.many_sessions = channel.many_sessions
        self._transport.channel = channel
        if self._hello_session is not None:     # a spare says HELLO when it is claimed
            try:
                self._transport.emit(self._hello_message())
            except HiveMindChatError as e:
                self._fail(e)
                return
        self._ready.set()
        self._done.set()

    def _hello_message(self) -> HiveMessage:
        hello = self._hello_session
        if self.many_sessions:      # the hub merges each message's Session over this one:
            hello = {k: v for k, v in hello.items() if k in ("session_id", "site_id")}
        # no conversation of one session may fill another's gaps
        return HiveMessage(HiveMessageType.HELLO, {
            "session": hello, "site_id": self.config.site_id or "unknown"})

    def _on_bus(self, payload: Any):
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
        reply, routing, unshare = self.turns.route(reply, self.session_id, self.many_sessions)
        if unshare:
            self.many_sessions = False
        if reply is None:
            return
        if routing is None:
            self.reports.stopped(reply.turn_tag, reply.skill_id)
            return
        if routing.ignored:
            LOG.debug(f"ignoring reply: {routing.ignored}")
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
        if self.reports.refused(denied):   # an audio end or a stop, not an utterance
            return
        waiting = self.turns.unanswered(denied)
        plan = plan_denial(denied, code, reason, extra, len(waiting), self.topic)
        if plan.note:
            (LOG.warning if plan.loud else LOG.info)(plan.note)
        if plan.refuse is not None:
            self.turns.refuse(waiting, plan.refuse)
        for handle in waiting if plan.retry else ():
            handle.message.msg_type = plan.retry
            try:
                self._transport.emit(HiveMessage(HiveMessageType.BUS, payload=handle.message))
            except HiveMindChatError as e:
                self.turns.refuse([handle], e)

    def report_audio_end(self, tag: Optional[str] = None,
                         session_id: Optional[str] = None) -> None:
        self.reports.audio_end(session_id or self.session_id, tag)

    def _on_socket_error(self, error: Any):
        if isinstance(error, WebSocketConnectionClosedException) and self._opened:
            return   # the hub's close frame: on_close follows with its code and reason
        if not self._opened:
            self._fail(connect_failure(error, self.config,
                                       lambda text: redact(text, self.config, self.useragent)))
        elif not self._ready.is_set() and garbled(error):
            self._fail(HubUnreachableError(
                f"the connection to the hub broke during the handshake ({type(error).__name__}); "
                "the key was not refused: check the network path to the hub and its log"))
        elif not self._ready.is_set():
            self._on_socket_closed()
        else:
            self._on_socket_closed(broken=error if garbled(error) else None)

    def _on_socket_closed(self, broken: Any = None, close: Tuple[Any, str] = (None, "")):
        refusal = refusal_from_close(*close)
        if refusal is None and close[0] == 1008 and self.many_sessions and not self.heard:
            # A 5.x hub checks our static key against its pin only after the last handshake
            # message and answers nothing on success; its close often reaches us as "invalid
            # message" (it read our HELLO after dropping the session). Nothing else closes a
            # fresh v3 connection before its first answer.
            refusal = refusal_after_noise_handshake(close[1])
        if not self._ready.is_set():
            self._fail(refusal or closed_before_ready(self._opened, self._exchange is not None,
                                                      close[1]))
            return
        if refusal is not None and self._error is None:   # before _ended: start_turn
            self._error = refusal                           # raises it once ended
        self._ended.set()
        if refusal is not None:    # a 5.x hub checks our pinned key after the handshake
            self.turns.refuse(None, refusal)
            return
        self._fail_turns(f"the connection to the hub broke during the turn ({type(broken).__name__}): "
                         "the stream was corrupted" if broken is not None else
                         "the hub closed the connection during the turn")

    def _fail(self, error: HiveMindChatError):
        if self._error is None:
            self._error = error
        self._ended.set()
        self._done.set()
        self._transport.stop()

    def _on_untrusted(self, opened: Opened):
        """A frame we must not read past: the stream can no longer be trusted, close it."""
        reason, error = untrusted_frame(opened, self.config.max_frame_bytes)
        LOG.warning(f"closing the connection to the hub: {reason}")
        if not self._ready.is_set():
            self._fail(error)
            return
        self._ended.set()
        self._fail_turns(reason, kind=EndReason.read(opened.verdict.value))
        self._transport.stop()

    def _fail_turns(self, reason: str, kind: EndReason = EndReason.NONE):
        self.turns.lose_all(reason, kind)
