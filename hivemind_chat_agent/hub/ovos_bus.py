"""The OVOS mode's connection to the local ovos-core messagebus: websocket-client's
`WebSocketApp` on a thread of its own, reconnected whenever it closes.

ovos-messagebus is a plain websocket that relays every JSON message to every client, so a
`WebSocketApp` is all it takes (ovos-bus-client's `MessageBusClient` adds an emitter, handler
threads and a 5-60 s reconnect backoff we do not want: satellites are told at once while the
bus is down, and it is retried every `retry` seconds, up to `max_retry`). What it reports:
`on_up()` once a connection is open (before any message of it), `on_message(frame)` for each
frame (bytes: websocket-client's UTF-8 check is skipped, the JSON parser decodes), on the bus
thread, and `on_down()` once per connection that closed or failed to open
after having been up. `send(text)` writes from any thread (websocket-client locks its frames)
and raises `BusNotConnected` when there is no open connection.

Socket options: `socket_options(ws)` below is the one place the bus socket's options are set,
once per connection, in `on_open` before anything is sent: TCP_NODELAY, and
hub/bus_socket.keep_acks_quick (TCP_QUICKACK after every send and receive), so ovos-messagebus
never holds a reply behind the delayed ACK of its echo of our own message (issue 31: 40 ms a
turn; docs/performance.md).

Logging: websocket-client logs an ERROR ("[Errno 111] Connection refused - goodbye") on its
"websocket" logger for every connection that fails, which under hivemind-core's logging was a
line per retry for as long as ovos-core was down. Those records of the bus thread are dropped
(`QuietRetries`): this module says once that the bus is unreachable and once that it is back.
"""
import logging
import socket
import threading
from typing import Any, Callable, Optional

from ovos_utils.log import LOG

from hivemind_chat_agent.core.limits import shown
from hivemind_chat_agent.errors import HiveMindChatError
from hivemind_chat_agent.hub.bus_socket import keep_acks_quick, warn_of_delayed_acks

BUS_THREAD = "hivemind-chat-ovos-bus"


class QuietRetries(logging.Filter):
    """On websocket-client's logger: drops what it logs on the OVOS bus thread (each retry's
    "goodbye"), keeps what it logs for anyone else in the process."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != BUS_THREAD


def quiet_retries() -> None:
    """Install `QuietRetries` on websocket-client's logger, once per process."""
    logger = logging.getLogger("websocket")
    if not any(isinstance(f, QuietRetries) for f in logger.filters):
        logger.addFilter(QuietRetries())


class BusNotConnected(HiveMindChatError):
    """The OVOS messagebus connection is not open: the message was not sent."""


def socket_options(ws) -> None:
    """Set the options of the OVOS bus connection `ws` (a connected `websocket.WebSocket`; the
    one place to change them). TCP_NODELAY: a small utterance or audio end goes out at once
    instead of waiting behind the previous write's ACK (Nagle). keep_acks_quick: every frame is
    acknowledged as it is read (it also sets TCP_NODELAY; where it cannot apply, a wss:// bus's
    TLS socket or not Linux, TCP_NODELAY alone is set). warn_of_delayed_acks: the log says
    when ovos-core's side of this machine's route will still delay its ACKs."""
    if not keep_acks_quick(ws):
        ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    warn_of_delayed_acks(ws.sock)


class OvosBus:
    def __init__(self, url: str, on_message: Callable[[str], None],
                 on_up: Callable[[], None], on_down: Callable[[], None],
                 retry: float = 0.5, max_retry: float = 5.0,
                 configure_socket: Callable[[Any], None] = socket_options):
        self.url = url
        self.on_message = on_message
        self.on_up = on_up
        self.on_down = on_down
        self.retry, self.max_retry = retry, max_retry
        self.configure_socket = configure_socket
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._app: Any = None        # websocket.WebSocketApp while connecting or connected
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "OvosBus":
        quiet_retries()
        self._thread = threading.Thread(target=self._run, name=BUS_THREAD, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        import websocket
        delay = self.retry
        while not self._stop.is_set():
            was_up = threading.Event()

            def opened(app, was_up=was_up):
                try:
                    self.configure_socket(app.sock)
                except (OSError, AttributeError) as e:
                    LOG.warning(f"OVOS bus socket options not set: {type(e).__name__}: {e}")
                was_up.set()
                self.connected.set()
                self.on_up()

            app = websocket.WebSocketApp(
                self.url, on_open=opened,
                on_message=lambda _app, text: self._message(text),
                on_error=lambda _app, error: LOG.debug(
                    f"OVOS bus {self.url}: {type(error).__name__}"))
            self._app = app
            try:
                app.run_forever(skip_utf8_validation=True)
            except Exception as e:     # never let the bus thread die: retry instead
                LOG.warning(f"OVOS bus {self.url}: {type(e).__name__}: "
                            f"{shown(str(e), 200, quote=False)}")
            self.connected.clear()
            self._app = None
            if was_up.is_set():
                delay = self.retry
                LOG.warning(f"lost the OVOS messagebus at {self.url}; reconnecting")
                self.on_down()
            self._stop.wait(delay)
            delay = min(self.max_retry, delay * 2)

    def _message(self, text) -> None:
        try:
            self.on_message(text)
        except Exception as e:     # one bad message must not close the bus
            LOG.error(f"OVOS bus message handler raised {type(e).__name__}: "
                      f"{shown(str(e), 200, quote=False)}")

    def send(self, text: str) -> None:
        app = self._app
        if app is None or not self.connected.is_set() or app.sock is None:
            raise BusNotConnected(f"the OVOS messagebus at {self.url} is not connected")
        try:
            app.send(text)
        except Exception as e:
            raise BusNotConnected(f"the OVOS messagebus at {self.url} did not take the "
                                  f"message ({type(e).__name__})") from None

    def close(self) -> None:
        self._stop.set()
        app = self._app
        if app is not None:
            app.keep_running = False
            raw = getattr(app.sock, "sock", None)
            if raw is not None:  # the reading thread's select() wakes on a shut-down socket
                try:
                    raw.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
