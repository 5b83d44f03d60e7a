"""The websocket under one hub connection: TCP/TLS with a connect timeout, frames bounded by
their header, every frame through the frame gate, sealed sends. No HiveMind state lives here:
core/hub_link.py's `HubLink` is the protocol, and `HubConnection` (client/connection.py) the
owner this reports to through its `on_socket_*` methods (`SocketOwner`).

The socket is websocket-client's `WebSocketApp`, owned here with its callbacks, because it is
installed already (hivemind-bus-client depends on it: no new dependency), it reads in a plain
thread and sends from any thread, as the rest of the client works (callers' threads send, one
socket thread per connection reads, events hand over; an asyncio client would need a loop
thread and a bridge per call), and its ABNF frame buffer can be reached, so a frame is refused
by its header before its payload is read (compat.bound_frame_length).

hivemind-bus-client is used for what it is for: `HiveMessage` and its serialization here, the
handshakes' crypto in core/. Its `HiveMessageBusClient` is not used at all: its connect can miss
the hub's first HANDSHAKE (a stall), runs cpuinfo on every connect, reconnects forever
(docs/performance.md#why-the-code-is-as-it-is), and its constructor registers a blank Session
under our id in `SessionManager`.
"""
import functools
import socket
import ssl
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Protocol

import pybase64
from hivemind_bus_client.encryption import SupportedCiphers, SupportedEncodings
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hivemind_bus_client.util import serialize_message
from ovos_utils.log import LOG
from websocket import ABNF, WebSocketApp, WebSocketPayloadException, WebSocketProtocolException

from hivemind_chat_agent import compat
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.noise_keys import NoiseKeyring, cached_psk
from hivemind_chat_agent.client.tls_pins import TLSFailed, open_tls
from hivemind_chat_agent.core.exchange import ExchangeInputs, SecureChannel, frames_to_send
from hivemind_chat_agent.core.frames import Opened, Verdict, open_frame
from hivemind_chat_agent.errors import ConnectionLostError, HiveMindChatError, HubUnreachableError

# Fastest first; the hub picks the first one its config allows.
ENCODINGS = [SupportedEncodings.JSON_B64, SupportedEncodings.JSON_URLSAFE_B64,
             SupportedEncodings.JSON_B91, SupportedEncodings.JSON_Z85B,
             SupportedEncodings.JSON_Z85P, SupportedEncodings.JSON_B32,
             SupportedEncodings.JSON_HEX]
PING_INTERVAL, PING_TIMEOUT = 20, 10   # seconds: pings notice a hub that vanished silently


class SocketOwner(Protocol):
    """What the transport reports to, on its socket thread (client/connection.HubConnection)."""

    def on_socket_open(self) -> None: ...

    def on_socket_message(self, message: HiveMessage) -> None: ...

    def on_socket_untrusted(self, opened: Opened) -> None: ...

    def on_socket_error(self, error: Any) -> None: ...

    def on_socket_close(self, code: Any, reason: str) -> None: ...

    def on_session_reset(self, reason: str) -> None:
        """MQTT only: the hub's session of our key ended without a close."""


def garbled(error: Any) -> bool:
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


def _authorization(useragent: str, key: str) -> str:
    """hivemind-core reads the client's name and access key from the upgrade request's
    `authorization` query: base64("useragent:key"), as hivemind-bus-client writes it."""
    return pybase64.b64encode(f"{useragent}:{key}".encode("utf-8")).decode("utf-8")


def hub_url(cfg: ClientConfig, useragent: str) -> str:
    """The upgrade request's URL. It carries the access key: never log it (`redact`)."""
    return f"{cfg.url_host}:{cfg.port}?authorization={_authorization(useragent, cfg.key)}"


def hand_over(owner: SocketOwner, raw: Any, channel: Optional[SecureChannel],
              max_bytes: int) -> None:
    """One frame from the hub through the frame gate to `owner` (every transport's path)."""
    opened = open_frame(raw, channel, max_bytes)
    if opened.verdict is Verdict.MORE:
        return
    if opened.verdict is Verdict.OK:
        message = opened.message
        if message is None or message.msg_type == HiveMessageType.BINARY:
            return     # we asked for no binary payloads
        try:
            owner.on_socket_message(message)
        except Exception as e:  # a hostile message must not end the socket thread
            LOG.debug(f"ignoring unusable message from hub: {type(e).__name__}")
    elif opened.verdict is Verdict.DROP:
        if channel is not None:
            LOG.warning(f"dropped a frame from the hub: {opened.why}")
        else:
            LOG.debug(f"ignoring frame before the handshake: {opened.why}")
    else:
        owner.on_socket_untrusted(opened)


class Transport:
    """One hub's websocket: a `WebSocketApp` whose callbacks feed `owner`, no reconnect loop.
    `run_forever` (the socket thread) opens and reads it; `emit`, `hub_has_read`, `stop` and
    `release` are called from any thread. `channel` is set by the owner when the handshake
    completes; it is cleared here when the socket ends, so nothing is sent in plain text."""

    def __init__(self, owner: SocketOwner, cfg: ClientConfig, useragent: str):
        self._owner = owner
        self._config = cfg
        self._pending_raw: Optional[socket.socket] = None
        self._stopped = False
        self.channel: Optional[SecureChannel] = None    # set when the handshake completes
        self._send_lock = threading.Lock()   # Noise nonces: frames go out in sealed order
        self._pongs: Dict[bytes, threading.Event] = {}   # pings awaiting their pong
        self._hub_closed = threading.Event()   # the hub's close frame (or the socket's end)
        self._socket_thread: Optional[threading.Thread] = None   # runs run_forever
        self._app = WebSocketApp(hub_url(cfg, useragent), on_open=self._on_open,
                                 on_message=self._on_message, on_error=self._on_error,
                                 on_close=self._on_close, on_pong=self._on_pong)

    # ---- the socket thread: websocket-client's callbacks (its app first) ----
    def _on_open(self, _app) -> None:
        self._bound_frames()
        self._owner.on_socket_open()

    def _bound_frames(self) -> None:
        """Refuse a frame by its header, before reading it: websocket-client would otherwise
        buffer any length the hub announces, and the same for a message split into
        continuation frames."""
        compat.bound_frame_length(self._app.sock, self._config.max_frame_bytes, _FrameTooLarge)

    def _on_error(self, _app, error: Any) -> None:
        self.channel = None
        self._hub_gone()
        if isinstance(error, _FrameTooLarge):
            self._owner.on_socket_untrusted(Opened(Verdict.TOO_LARGE, why=str(error)))
            return
        self._owner.on_socket_error(error)

    def _on_pong(self, _app, data: Any) -> None:
        waiter = self._pongs.get(bytes(data or b""))
        if waiter is not None:
            waiter.set()

    def _on_close(self, _app, code: Any = None, reason: Any = None) -> None:
        """websocket-client passes the hub's close code and reason: a 5.x hub says why it
        refused (1008 "invalid api key", "... contradicts the pinned key")."""
        self.channel = None
        self._hub_gone()
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        self._owner.on_socket_close(code, reason or "")

    def _on_message(self, _app, raw: Any) -> None:
        self._ack_now()
        hand_over(self._owner, raw, self.channel, self._config.max_frame_bytes)

    def _hub_gone(self) -> None:
        """The socket ended: nothing waits for a pong or a close any longer."""
        self._hub_closed.set()
        for waiter in list(self._pongs.values()):
            waiter.set()

    def _ack_now(self) -> None:
        """Acknowledge received data at once instead of after the ~40 ms delayed-ACK timer.

        hivemind-core's tornado server does not set TCP_NODELAY, so its `handled` frame, written
        right after a `speak`, is held by Nagle's algorithm until our ACK of the `speak` arrives.
        Linux resets TCP_QUICKACK after each ACK, hence once per frame."""
        raw = getattr(self._app.sock, "sock", None)
        if raw is not None and _QUICKACK is not None:
            try:
                raw.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                pass

    def run_forever(self) -> None:
        """The socket thread. Opens the TCP (and TLS) connection itself, bounded by
        connect_timeout (websocket-client has none, so a filtered address would hold this
        thread for minutes, past shutdown()), verifies or pins the hub's certificate before the
        upgrade request, which carries the access key (client/tls_pins.py), then reads until
        the socket ends. A failure before the upgrade reaches the owner as on_socket_error."""
        self._socket_thread = threading.current_thread()
        raw = self._open_socket()
        if raw is None:
            return
        self._app.prepared_socket = raw
        # websocket-client upgrades the prepared socket as it is and, with reconnect=0, never
        # opens another; were it ever to open one itself, its default would be CERT_NONE:
        # sslopt makes that verify
        self._app.run_forever(ping_interval=PING_INTERVAL, ping_timeout=PING_TIMEOUT,
                              sslopt={"cert_reqs": ssl.CERT_REQUIRED}, reconnect=0)

    def _open_socket(self) -> Optional[socket.socket]:
        """The connected TCP/TLS socket, or None (the owner was told why, or stop() ran)."""
        cfg, raw = self._config, None
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                cfg.host, cfg.port, type=socket.SOCK_STREAM)[0]
            raw = socket.socket(family, kind, proto)
            self._pending_raw = raw          # stop() can reach it while it connects
            raw.settimeout(cfg.connect_timeout)
            raw.connect(address)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if cfg.secure:
                raw = open_tls(raw, cfg)
            raw.settimeout(None)
        except Exception as e:   # refused, unreachable, timed out, TLS failure, stopped
            if raw is not None:
                raw.close()
            self._pending_raw = None
            self._on_error(self._app, e)
            return None
        self._pending_raw = None
        if self._stopped:                  # stopped while connecting
            raw.close()
            return None
        return raw

    # ---- any thread ----
    def emit(self, message: HiveMessage) -> None:
        """Send one message: its frames (core.exchange.frames_to_send: the handshake in the
        clear, the rest sealed by the channel read once here) sealed and written under one
        lock; any failure is a ConnectionLostError."""
        text = serialize_message(message)
        try:
            with self._send_lock:
                for data, binary in frames_to_send(message.msg_type, text, self.channel):
                    self._app.send(data, ABNF.OPCODE_BINARY if binary else ABNF.OPCODE_TEXT)
        except ConnectionLostError:
            raise
        except Exception as e:
            raise ConnectionLostError(f"could not send to the hub ({type(e).__name__}); the "
                                      "connection is gone and the next turn reconnects") from None

    def hub_has_read(self, timeout: float) -> bool:
        """Ping and wait (at most `timeout`) for the pong. The hub's tornado reads a
        connection's frames in order and runs each message's handler before reading the next,
        so the pong means every frame sent before the ping has been handled (our HELLO, and
        with it the hub's client table changed). False if no pong came."""
        ws = self._app.sock
        if ws is None:           # closed already: nothing to wait for
            return False
        token = uuid.uuid4().bytes
        waiter = self._pongs[token] = threading.Event()
        try:
            with self._send_lock:
                ws.ping(token)
            return waiter.wait(timeout) and not self._hub_closed.is_set()
        except Exception:        # closed meanwhile: nothing to wait for
            return False
        finally:
            self._pongs.pop(token, None)

    def stop(self, wait_for_hub: float = 0.0) -> None:
        """End the socket thread now. `WebSocketApp.close()` alone leaves it blocked in select()
        for up to its ping timeout; shutting the socket down wakes it at once. With
        `wait_for_hub`, first wait (at most that long) for the hub's answering close frame:
        tornado sends it as it drops the connection from its client table, so a frame sent
        after it, on any connection, reaches a hub that has done so."""
        app = self._app
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
        if ws is None or raw is None:
            return
        try:
            ws.send_close()
        except Exception:
            wait_for_hub = 0.0
        if wait_for_hub > 0 and threading.current_thread() is not self._socket_thread:
            self._hub_closed.wait(wait_for_hub)
        try:
            raw.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def release(self) -> None:
        """Close the socket's file descriptor now (after stop() and the thread's end), instead
        of whenever the garbage collector gets to it."""
        ws = self._app.sock
        if ws is not None:
            try:
                ws.shutdown()      # closes the socket at once (close() would wait for the hub)
            except Exception:
                pass
        raw = getattr(ws, "sock", None) or self._app.prepared_socket
        if raw is not None:
            try:
                raw.close()
            except OSError:
                pass
        self._app.prepared_socket = None


def connect_failure(error: Any, cfg: ClientConfig,
                    redact: Callable[[str], str]) -> HiveMindChatError:
    """The typed error for a connection that never opened (before any websocket frame)."""
    where = f"{cfg.url_host}:{cfg.port}"
    if isinstance(error, HiveMindChatError):     # a certificate refused before the upgrade
        return error
    if isinstance(error, TLSFailed):
        return HubUnreachableError(str(error))
    if isinstance(error, (socket.timeout, TimeoutError)):
        return HubUnreachableError(
            f"no HiveMind hub answered at {where} within {cfg.connect_timeout:g} s; check host "
            "and port and that hivemind-core is running")
    if isinstance(error, ConnectionRefusedError):
        return HubUnreachableError(f"connection refused by {where}; check host and port and "
                                   "that hivemind-core is running")
    return HubUnreachableError(f"could not connect to {where} ({type(error).__name__}: "
                               f"{redact(str(error))}); check host, port and TLS settings")


class _FrameTooLarge(Exception):
    def __init__(self, size: int):
        super().__init__(f"a frame of {size} bytes")


def open_transport(owner: SocketOwner, cfg: ClientConfig, useragent: str) -> Any:
    """The websocket for one HubConnection (`owner` gets its callbacks), not yet connected;
    for an mqtt:// host, the MQTT transport (client/mqtt_transport.py, the [mqtt] extra)."""
    compat.for_client()
    if cfg.transport == "mqtt":
        from hivemind_chat_agent.extras import require
        require("mqtt", f"host {cfg.url_host}")
        from hivemind_chat_agent.client.mqtt_transport import MqttTransport
        return MqttTransport(owner, cfg, useragent)
    return Transport(owner, cfg, useragent)


def exchange_inputs(cfg: ClientConfig) -> ExchangeInputs:
    """What either generation's handshake needs from this client."""
    address = f"{cfg.host}:{cfg.port}"
    if cfg.transport == "mqtt":   # a broker carries as many hubs as topic prefixes
        address = f"{cfg.url_host}:{cfg.port}/{cfg.topic_prefix}"
    return ExchangeInputs(
        password=cfg.password, hub_address=address,
        noise_keys=NoiseKeyring(cfg.noise_key_dir, cfg.key), psk=cached_psk,
        encodings=tuple(e.value for e in ENCODINGS), ciphers=tuple(preferred_ciphers()),
        max_message_bytes=cfg.max_frame_bytes)


def redact(text: str, cfg: ClientConfig, useragent: str) -> str:
    """Library errors may quote the URL, whose query carries base64("useragent:key")."""
    for secret in (cfg.key, cfg.password, _authorization(useragent, cfg.key),
                   cfg.broker_password):
        if secret:
            text = text.replace(secret, "***")
    return text
