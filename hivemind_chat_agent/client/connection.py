"""One authenticated, encrypted HiveMind connection: the thin I/O shell around `TurnTable`.

hivemind-bus-client's `HiveMessageBusClient` still moves the frames (websocket, ciphers,
encodings), but this module owns what its stock protocol gets wrong for a chat client
(field notes):

* the password handshake is bound before the socket thread starts, so the hub's first HANDSHAKE
  can never be missed (the library's 5 s stall);
* cipher preference is computed once per process, not by `cpuinfo` on every connect (1.1 s);
* no automatic reconnect: a refused key, a wrong password or a dead hub is reported once, as a
  typed error, and the next turn decides whether to reconnect;
* replies are not written into `SessionManager` for whatever session they name: they go through
  `parse_reply` and `TurnTable.route`, and only the reply's own session is refreshed;
* nothing but the handshake is ever sent before the session key exists.

Like a satellite, it reports `recognizer_loop:audio_output_end` for every sentence it receives
(at once: it has no speaker), because skills that speak with wait=True block until then; a
caller that plays the audio itself sets `plays_audio` and reports through the agent.
"""
import functools
import queue
import socket
import ssl
import uuid
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import pybase64
from hivemind_bus_client.client import HiveMessageBusClient
from hivemind_bus_client.encryption import SupportedCiphers, SupportedEncodings, encrypt_as_json
from hivemind_bus_client.identity import NodeIdentity
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hivemind_bus_client.util import serialize_message
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session, SessionManager
from ovos_utils.log import LOG
from poorman_handshake import PasswordHandShake
from websocket import WebSocketPayloadException, WebSocketProtocolException

from hivemind_chat_agent import background, leak_free_codecs
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.errors import (AccessKeyRejectedError, AuthenticationError,
                                        ConnectionLostError, HandshakeTimeoutError,
                                        HiveMindChatError, HubUnreachableError,
                                        ReplyTooLargeError, WrongPasswordError)
from hivemind_chat_agent.core.frames import Opened, Verdict, open_frame
from hivemind_chat_agent.core.protocol_names import (AUDIO_OUTPUT_END_TYPE, TURN_TAG_KEY,
                                                UTTERANCE_TYPE)
from hivemind_chat_agent.core.replies import ReplyKind, parse_reply
from hivemind_chat_agent.core.sessions import SessionBook
from hivemind_chat_agent.core.turns import Absorb, Event, Turn, TurnTable

# Fastest first; the hub picks the first one its config allows.
_ENCODINGS = [SupportedEncodings.JSON_B64, SupportedEncodings.JSON_URLSAFE_B64,
              SupportedEncodings.JSON_B91, SupportedEncodings.JSON_Z85B,
              SupportedEncodings.JSON_Z85P, SupportedEncodings.JSON_B32,
              SupportedEncodings.JSON_HEX]
leak_free_codecs.install()   # a hub that picks JSON-B91/Z85 must not leak every frame here


def _garbled(error: Any) -> bool:
    """Did websocket-client give up on the bytes (bad UTF-8, broken framing) rather than see
    the peer close? Then nobody refused anything: the stream was corrupted on the way."""
    return isinstance(error, (WebSocketPayloadException, WebSocketProtocolException,
                              UnicodeError))


@functools.lru_cache(maxsize=1)
def preferred_ciphers() -> List[str]:
    """AES-GCM first where the CPU has AES instructions, as the library decides, but read from
    /proc/cpuinfo once instead of running cpuinfo (about 1.1 s) on every connection."""
    aes = True
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    aes = "aes" in line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    order = [SupportedCiphers.AES_GCM, SupportedCiphers.CHACHA20_POLY1305]
    return [c.value for c in (order if aes else order[::-1])]


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)   # Linux only


class _NullBus:
    """The library mirrors every BUS message onto an internal bus; we take replies directly."""

    def __init__(self, session_id: str):
        self.session_id = session_id

    def emit(self, *_args, **_kwargs):
        pass

    def on(self, *_args, **_kwargs):
        pass

    def remove(self, *_args, **_kwargs):
        pass


class _IdentityInMemory(dict):
    """Keeps a connection's credentials out of ~/.config/hivemind/_identity.json."""
    path = ""


class _Transport(HiveMessageBusClient):
    """HiveMessageBusClient with its callbacks pointed at a `HubConnection` and no reconnect loop."""

    def __init__(self, owner: "HubConnection", **kwargs):
        self._owner = owner
        self._pending_raw: Optional[socket.socket] = None
        self._stopped = False
        super().__init__(**kwargs)

    # The library's connect(), wait_for_handshake() and emit() are never called, so neither are
    # its connected/handshake events kept here: HubConnection tracks that state itself.
    def on_open(self, *_args):
        self._bound_frames()
        self._owner._on_open()

    def _bound_frames(self):
        """Refuse a frame by its header, before reading it: websocket-client would otherwise
        buffer any length the hub announces (a 50 MB frame cost 65-122 MB), and the same for
        a message split into continuation frames."""
        ws = self.client.sock
        buffer, cont = getattr(ws, "frame_buffer", None), getattr(ws, "cont_frame", None)
        if buffer is None or cont is None:
            return
        limit = self._owner.config.max_frame_bytes
        read_length = buffer.recv_length

        def bounded_length():
            read_length()
            pending = len(cont.cont_data[1]) if cont.cont_data else 0
            if (buffer.length or 0) + pending > limit:
                raise _FrameTooLarge(buffer.length + pending)
        buffer.recv_length = bounded_length

    def on_error(self, *args):
        self.crypto_key = None
        error = args[-1] if args else None
        if isinstance(error, _FrameTooLarge):
            self._owner._on_untrusted(Opened(Verdict.TOO_LARGE, why=str(error)))
            return
        self._owner._on_socket_error(error)

    def on_close(self, *_args):
        self.crypto_key = None
        self._owner._on_socket_closed()

    def on_message(self, *args):
        self._ack_now()
        opened = open_frame(args[-1] if args else None, self.crypto_key, self.cipher,
                            self.json_encoding, self._owner.config.max_frame_bytes)
        if opened.verdict is Verdict.OK:
            if opened.message.msg_type == HiveMessageType.BINARY:
                return     # we asked for no binary payloads
            try:
                self._handle_hive_protocol(opened.message)
            except Exception as e:  # a hostile message must not end the socket thread
                LOG.debug(f"ignoring unusable message from hub: {type(e).__name__}")
        elif opened.verdict is Verdict.DROP:
            if self.crypto_key:
                LOG.warning(f"dropped a frame from the hub: {opened.why}")
            else:
                LOG.debug(f"ignoring frame before the handshake: {opened.why}")
        else:
            self._owner._on_untrusted(opened)

    def _ack_now(self):
        """Acknowledge received data at once instead of after the ~40 ms delayed-ACK timer.

        hivemind-core's tornado server does not set TCP_NODELAY, so its `handled` frame, written
        right after a `speak`, is held by Nagle's algorithm until our ACK of the `speak` arrives.
        Linux resets TCP_QUICKACK after each ACK, hence once per frame."""
        raw = getattr(getattr(self.client, "sock", None), "sock", None)
        if raw is not None and _QUICKACK is not None:
            try:
                raw.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                pass

    @staticmethod
    def _tls(raw, cfg):
        """TLS over the connected socket. A plain-text hub never answers a ClientHello (its
        HTTP parser waits for the end of a request line), so the handshake gets a short bound
        of its own and a failure says what it means."""
        context = ssl.create_default_context()
        if cfg.self_signed:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        raw.settimeout(min(cfg.connect_timeout, TLS_HANDSHAKE_TIMEOUT))
        try:
            return context.wrap_socket(raw, server_hostname=cfg.host)
        except (ssl.SSLError, socket.timeout, OSError) as e:
            raise _TLSFailed(f"the TLS handshake with {cfg.host}:{cfg.port} failed "
                             f"({type(e).__name__}): is the hub serving TLS? Use ws:// for a "
                             "plain hub, wss:// only for one with a certificate") from None

    def _handle_hive_protocol(self, message: HiveMessage):
        self._owner._on_hive_message(message)

    def emit(self, message: HiveMessage, *_args, **_kwargs):
        """Send one frame. Everything but the handshake is encrypted with the session key read
        once here (the library reads it twice, and the socket thread may clear it in between,
        which would send the frame in plain text); any failure is a ConnectionLostError."""
        text = serialize_message(message)
        if message.msg_type != HiveMessageType.HANDSHAKE:
            key = self.crypto_key
            if not key:
                raise ConnectionLostError("refusing to send before the connection is encrypted; "
                                          "the handshake did not complete")
            text = encrypt_as_json(key, text, cipher=self.cipher, encoding=self.json_encoding)
        try:
            self.client.send(text)
        except Exception as e:
            raise ConnectionLostError(f"could not send to the hub ({type(e).__name__}); the "
                                      "connection is gone and the next turn reconnects") from None

    def stop(self):
        """End the socket thread now. `WebSocketApp.close()` alone leaves it blocked in select()
        for up to its ping timeout; shutting the socket down wakes it at once."""
        app = self.client
        app.keep_running = False
        self._stopped = True
        pending = self._pending_raw   # a TCP/TLS connect still in progress
        if pending is not None:
            try:
                pending.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        ws = app.sock
        raw = getattr(ws, "sock", None)
        if raw is None:
            return
        try:
            ws.send_close()
        except Exception:
            pass
        try:
            raw.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def release(self):
        """Close the socket's file descriptor now (after stop() and the thread's end), instead
        of whenever the garbage collector gets to it."""
        ws = self.client.sock
        if ws is not None:
            try:
                ws.shutdown()      # closes the socket at once (close() would wait for the hub)
            except Exception:
                pass
        raw = getattr(ws, "sock", None) or self.client.prepared_socket
        if raw is not None:
            try:
                raw.close()
            except OSError:
                pass
        self.client.prepared_socket = None

    def run_forever(self):
        """Open the TCP (and TLS) connection ourselves, bounded by connect_timeout: websocket-
        client has no connect timeout, so a filtered address would hold this thread for minutes,
        past shutdown()."""
        cfg = self._owner.config
        raw = None
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                cfg.host, cfg.port, type=socket.SOCK_STREAM)[0]
            raw = socket.socket(family, kind, proto)
            self._pending_raw = raw          # stop() can reach it while it connects
            raw.settimeout(cfg.connect_timeout)
            raw.connect(address)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if cfg.secure:
                raw = self._tls(raw, cfg)
            raw.settimeout(None)
        except Exception as e:   # refused, unreachable, timed out, TLS failure, stopped
            if raw is not None:
                raw.close()
            self._pending_raw = None
            self.on_error(self.client, e)
            return
        self._pending_raw = None
        if self._stopped:                  # stopped while connecting
            raw.close()
            return
        self.client.prepared_socket = raw
        # pings notice a hub that vanished without closing the socket
        self.client.run_forever(ping_interval=20, ping_timeout=10)


TLS_HANDSHAKE_TIMEOUT = 2.0   # seconds; a TLS hub on a LAN answers in milliseconds


class _TLSFailed(Exception):
    pass


class _FrameTooLarge(Exception):
    def __init__(self, size: int):
        super().__init__(f"a frame of {size} bytes")


class TurnHandle:
    """What a caller waits on: the turn's state machine plus a queue of its events."""

    def __init__(self, turn: Turn):
        self.turn = turn
        self.events: "queue.SimpleQueue[Event]" = queue.SimpleQueue()

    def push(self, events: List[Event]) -> None:
        for event in events:
            self.events.put(event)


class HubConnection:
    """One websocket to the hub carrying one session's turns (a 4.0 hub binds one session to a
    connection; `TurnTable` is keyed by session so a multiplexing hub could share one)."""

    def __init__(self, config: ClientConfig, session: Session, book: SessionBook,
                 on_aside: Callable[[str, str], None] = lambda sid, text: None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.session_id = session.session_id
        self._book = book
        self._on_aside = on_aside   # a sentence spoken outside any turn (socket thread)
        # hivemind-core files connections under "useragent::client::name::session": two with
        # the same name and session (two processes, or a reconnect racing the old close) would
        # overwrite each other's entry, so every connection gets a name of its own.
        self.useragent = f"{config.useragent}-{uuid.uuid4().hex[:8]}"
        self._hello_session = book.wire(session)
        self.untagged = False               # the hub dropped our turn tag from some reply
        self._clock = clock
        self._lock = threading.Lock()
        self._table = TurnTable()
        self._handles: Dict[str, TurnHandle] = {}
        self._ready = threading.Event()
        self._done = threading.Event()      # ready or failed, whichever first
        self._error: Optional[HiveMindChatError] = None
        self._opened = False
        self._closed = False
        self._pswd: Optional[PasswordHandShake] = None
        self._thread: Optional[threading.Thread] = None
        self.last_used = clock()
        self.leases = 0                     # turns holding this connection (the pool's lock)
        self._transport = self._make_transport()

    # ---- lifecycle (caller's thread) ----
    def _make_transport(self) -> _Transport:
        cfg = self.config
        identity = NodeIdentity(identity_file=_IdentityInMemory(name=self.useragent))
        identity.site_id = cfg.site_id or "unknown"
        # The library's constructor registers a blank Session under our id; keep the real one.
        saved = SessionManager.sessions.get(self.session_id)
        try:
            return _Transport(self, key=cfg.key, password=cfg.password, host=cfg.url_host,
                              port=cfg.port, useragent=self.useragent,
                              self_signed=cfg.self_signed, identity=identity,
                              internal_bus=_NullBus(self.session_id))
        finally:
            if saved is not None:
                SessionManager.sessions[self.session_id] = saved
            else:
                SessionManager.sessions.pop(self.session_id, None)

    def connect(self) -> "HubConnection":
        """Open the socket and finish the password handshake, or raise a typed error."""
        self._thread = threading.Thread(target=self._transport.run_forever, daemon=True,
                                        name=f"hivemind-chat-{self.session_id}")
        background.start(self._thread)
        if not self._done.wait(self.config.connect_timeout):
            opened = self._opened
            self.close()
            where = f"{self.config.url_host}:{self.config.port}"
            if opened:
                raise HandshakeTimeoutError(
                    f"the hub at {where} accepted the connection but did not finish the "
                    f"handshake within {self.config.connect_timeout:g} s; check that it is a "
                    "HiveMind hub and that it is not overloaded")
            raise HubUnreachableError(
                f"no HiveMind hub answered at {where} within {self.config.connect_timeout:g} s; "
                "check host and port and that hivemind-core is running")
        if self._error is not None:
            self.close()
            raise self._error
        if self._closed:
            raise ConnectionLostError("the connection was closed while it was being opened")
        return self

    @property
    def alive(self) -> bool:
        return self._ready.is_set() and not self._closed

    def close(self) -> None:
        """Close the socket and end the socket thread; waiting turns end as LOST."""
        self._closed = True
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
        turn = Turn(session_id=session.session_id, tag=tag, timeout=timeout,
                    started_at=self._clock())
        handle = TurnHandle(turn)
        with self._lock:
            if not self.alive:
                raise ConnectionLostError("the connection to the hub is closed; retry the turn")
            self._table.open(turn)
            self._handles[session.session_id] = handle
        wire = self._book.wire(session)
        data = {"utterances": [utterance]}
        if "lang" in wire:
            data["lang"] = wire["lang"]
        message = Message(UTTERANCE_TYPE, data,
                          {"session": wire, TURN_TAG_KEY: tag,
                           "source": self.useragent, "platform": self.config.useragent,
                           "destination": "HiveMind"})
        self.last_used = self._clock()
        try:
            self._transport.emit(HiveMessage(HiveMessageType.BUS, payload=message))
        except HiveMindChatError:
            self.finish_turn(handle)
            raise
        return handle   # a close from now on reaches the turn as LOST (_fail_turns)

    def expire(self, handle: TurnHandle) -> None:
        with self._lock:
            handle.push(handle.turn.expire(self._clock()))

    def abort(self, handle: TurnHandle, reason: str) -> None:
        with self._lock:
            handle.push(handle.turn.abort(reason))

    def finish_turn(self, handle: TurnHandle) -> None:
        with self._lock:
            self._table.close(handle.turn)
            if self._handles.get(handle.turn.session_id) is handle:
                del self._handles[handle.turn.session_id]
        self.last_used = self._clock()

    # ---- socket thread ----
    def _on_open(self):
        self._opened = True

    def _on_hive_message(self, message: HiveMessage):
        if message.msg_type == HiveMessageType.BUS:
            self._on_bus(message.payload)
        elif message.msg_type == HiveMessageType.HANDSHAKE:
            self._on_handshake(message.payload)
        elif message.msg_type != HiveMessageType.HELLO:
            LOG.debug(f"ignoring hive message of type {message.msg_type}")

    def _on_handshake(self, payload: Any):
        if not isinstance(payload, dict) or self._ready.is_set():
            return
        if "envelope" not in payload:   # the hub asks us to start
            if not payload.get("password"):
                self._fail(AuthenticationError(
                    "the hub has no password for this client, so no key can be derived; "
                    "register it with `hivemind-core add-client --password ...`"))
                return
            self._pswd = PasswordHandShake(self.config.password)
            self._transport.emit(HiveMessage(HiveMessageType.HANDSHAKE, {
                "binarize": False, "encodings": [e.value for e in _ENCODINGS],
                "ciphers": preferred_ciphers(), "envelope": self._pswd.generate_handshake()}))
            return
        if self._pswd is None:
            return
        envelope = payload.get("envelope")
        try:
            valid = isinstance(envelope, str) and self._pswd.verify(envelope)
        except Exception:
            valid = False
        if not valid:
            self._fail(WrongPasswordError(
                "the hub's handshake does not match this password: the password is wrong for "
                "this access key; check it or re-register with `hivemind-core add-client`"))
            return
        self._pswd.receive_handshake(envelope)
        self._transport.json_encoding = payload.get("encoding") or SupportedEncodings.JSON_HEX
        self._transport.cipher = payload.get("cipher") or SupportedCiphers.AES_GCM
        self._transport.crypto_key = self._pswd.secret
        self._transport.emit(HiveMessage(HiveMessageType.HELLO, {
            "session": self._hello_session, "site_id": self.config.site_id or "unknown"}))
        self._ready.set()
        self._done.set()

    def _on_bus(self, payload: Any):
        try:
            reply, why = parse_reply(payload.msg_type, payload.data, payload.context)
        except Exception as e:
            reply, why = None, f"unreadable payload ({type(e).__name__})"
        if reply is None:
            LOG.debug(f"ignoring reply: {why}")
            return
        if reply.session_id != self.session_id:
            LOG.debug(f"ignoring {reply.msg_type} for another session")
            return
        with self._lock:
            routing = self._table.route(reply, self._clock())
            if routing.absorb is not Absorb.NOTHING:
                self._book.absorb(reply.session_id, reply.session,
                                  response_mode_only=routing.absorb is Absorb.RESPONSE_MODE)
            if routing.turn is not None:
                if reply.turn_tag is None:
                    self.untagged = True
                self._handles[routing.turn.session_id].push(routing.events)
        if routing.ignored:
            LOG.debug(f"ignoring reply: {routing.ignored}")
        if reply.kind is ReplyKind.SPEAK and not self.config.plays_audio:
            if routing.events:
                time.sleep(0)   # let the woken caller take the sentence before we encrypt
            self.report_audio_end(reply.turn_tag)
        if routing.aside is not None:
            self._on_aside(reply.session_id, routing.aside)

    def report_audio_end(self, tag: Optional[str] = None) -> None:
        """Tell the hub this session's speech has been played, as a satellite does after each
        sentence: skills that spoke with wait=True go on."""
        sess = SessionManager.sessions.get(self.session_id)
        if sess is None or not self._ready.is_set() or self._closed:
            return
        context = {"session": self._book.wire(sess), "source": self.useragent,
                   "destination": "HiveMind"}
        if tag is not None:
            context[TURN_TAG_KEY] = tag
        try:
            self._transport.emit(HiveMessage(HiveMessageType.BUS, payload=Message(
                AUDIO_OUTPUT_END_TYPE, {}, context)))
        except HiveMindChatError as e:
            LOG.debug(f"could not report audio end: {e}")

    def _on_socket_error(self, error: Any):
        if isinstance(error, _TLSFailed):
            self._fail(HubUnreachableError(str(error)))
            return
        if isinstance(error, (socket.timeout, TimeoutError)) and not self._opened:
            self._fail(HubUnreachableError(
                f"no HiveMind hub answered at {self.config.url_host}:{self.config.port} within "
                f"{self.config.connect_timeout:g} s; check host and port and that "
                "hivemind-core is running"))
        elif isinstance(error, ConnectionRefusedError):
            self._fail(HubUnreachableError(
                f"connection refused by {self.config.url_host}:{self.config.port}; check host "
                "and port and that hivemind-core is running"))
        elif not self._ready.is_set() and self._opened and _garbled(error):
            self._fail(HubUnreachableError(
                f"the connection to the hub broke during the handshake ({type(error).__name__}); the "
                "key was not refused: check the network path to the hub and its log"))
        elif not self._ready.is_set() and self._opened:
            self._on_socket_closed()
        elif not self._ready.is_set():
            self._fail(HubUnreachableError(
                f"could not connect to {self.config.url_host}:{self.config.port} "
                f"({type(error).__name__}: {self._redact(str(error))}); check host, port and "
                "TLS settings"))
        else:
            self._on_socket_closed(broken=error if _garbled(error) else None)

    def _on_socket_closed(self, broken: Any = None):
        if not self._ready.is_set():
            if self._opened and self._pswd is None:
                self._fail(AccessKeyRejectedError(
                    "the hub closed the connection before the handshake: it does not know this "
                    "access key; check the key or register it with `hivemind-core add-client`"))
            else:
                self._fail(HubUnreachableError(
                    "the hub closed the connection during the handshake; check the hub's log"))
            return
        self._closed = True
        self._fail_turns(f"the connection to the hub broke during the turn ({type(broken).__name__}): "
                         "the stream was corrupted" if broken is not None else
                         "the hub closed the connection during the turn")

    def _redact(self, text: str) -> str:
        """Library errors may quote the URL, whose query carries base64("useragent:key")."""
        for secret in (self.config.key, self.config.password,
                       pybase64.b64encode(f"{self.useragent}:{self.config.key}".encode()
                                          ).decode()):
            text = text.replace(secret, "***")
        return text

    def _fail(self, error: HiveMindChatError):
        if self._error is None:
            self._error = error
        self._closed = True
        self._done.set()
        self._transport.stop()

    def _on_untrusted(self, opened: Opened):
        """A frame we must not read past: the stream can no longer be trusted, close it."""
        limit = self.config.max_frame_bytes
        if opened.verdict is Verdict.TOO_LARGE:
            reason = (f"the hub sent {opened.why}, over max_frame_bytes={limit}; the "
                      "connection was closed without reading it. Raise max_frame_bytes if "
                      "the hub's answers are really that long")
        else:
            reason = (f"a frame from the hub {opened.why.replace('frame ', '', 1)}: someone "
                      "tampered with the connection (or the hub is broken), so it was closed "
                      "and nothing more from it was read; use wss:// on untrusted networks")
        LOG.warning(f"closing the connection to the hub: {reason}")
        if not self._ready.is_set():
            self._fail(ReplyTooLargeError(reason) if opened.verdict is Verdict.TOO_LARGE
                       else HubUnreachableError(reason))
            return
        self._closed = True
        self._fail_turns(reason, kind=opened.verdict.value)
        self._transport.stop()

    def _fail_turns(self, reason: str, kind: str = ""):
        with self._lock:
            for handle in self._handles.values():
                handle.push(handle.turn.lose(reason, kind))
