"""The HTTP edge the OpenAI and MCP fronts share: an ASGI wrapper that applies
core/front_guard's decisions before the application sees a request, and a uvicorn server with
deadlines and connection caps.

`GuardedApp` (around any ASGI app):
- Host, Origin, Content-Type and the key are checked from the headers, before one byte of the
  body is read; a refusal is answered by the front's own error shape.
- The body is read here, at most `max_body` bytes whatever the framing (a chunked body past the
  limit is refused as it arrives, so memory stays flat), then handed to the app.
- A caller who hangs up ends its request at once: the app's task is cancelled, which stops the
  hub's answer (the fronts terminate their turn when cancelled) and frees the caller's place.

`serve` runs uvicorn with a protocol that closes connections whose request does not arrive in
time (a half-sent header, a trickled body, one that never sends anything), refuses connections
over a total and a per-peer cap at accept, and closes idle keep-alive connections.
"""
import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, Optional, Tuple

from hivemind_chat_agent.core.front_guard import FrontGuard, Refusal
from hivemind_chat_agent.core.peer_gate import Caps, PeerGate

LOG = logging.getLogger("hivemind_chat_agent.bridges.http_front")

CALLER = "hivemind_chat.caller"      # the scope key naming the admitted caller for the app
METRICS_PATH = "/metrics"
HUNG_UP = 499           # the status counted for a caller gone before its answer began (nginx's)
ErrorShape = Callable[[Refusal], Dict[str, Any]]


@dataclass(frozen=True)
class Limits:
    """A front's bounds. Seconds: `read_timeout` for a request's headers, and again for its
    body; `keep_alive` for an idle connection between requests."""
    max_body: int = 1 << 20
    max_connections: int = 256
    max_per_peer: int = 128         # half of them: one address never takes every descriptor
    read_timeout: float = 10.0
    keep_alive: float = 5.0


def add_limit_options(p, connections: int = Limits.max_connections) -> None:
    """The CLI options every HTTP front takes for who may reach it and its bounds."""
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a Host name clients may use besides loopback and the bind address "
                        "(repeatable), e.g. the machine's LAN name")
    p.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin allowed to call the server from a browser "
                        "(repeatable), e.g. https://chat.example.org; loopback pages are "
                        "allowed, others get 403")
    p.add_argument("--max-connections", type=int, default=connections, metavar="N",
                   help=f"open connections in all (default {connections}; half of them "
                        "per peer address), more are closed at accept")
    p.add_argument("--turns-per-caller", type=int, default=64, metavar="N",
                   help="requests in flight per API key (all callers together without keys); "
                        "more get 429 (default 64)")
    p.add_argument("--read-timeout", type=float, default=Limits.read_timeout,
                   metavar="SECONDS", help="a request's headers, and its body, must arrive "
                                           "within this (default 10)")
    p.add_argument("--metrics", action="store_true",
                   help="serve Prometheus metrics at GET /metrics on this server, behind the "
                        "same checks as the API (Host, Origin, the API key when there are "
                        "keys); needs the [metrics] extra (docs/metrics.md)")


def limits_from(args) -> Limits:
    return Limits(max_connections=args.max_connections,
                  max_per_peer=max(1, args.max_connections // 2),
                  read_timeout=args.read_timeout)


def _refusal_headers(refusal: Refusal, close: bool) -> list:
    headers = [(b"content-type", b"application/json")]
    if refusal.retry_after is not None:
        headers.append((b"retry-after", str(refusal.retry_after).encode()))
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if close:
        headers.append((b"connection", b"close"))
    return headers


class GuardedApp:
    """`app` behind `guard`; `turn_paths`: POSTs there are turns (counted per caller);
    `error_shape`: the JSON body of a refusal, in the front's own protocol; `public_paths`:
    GETs there need no key (FrontGuard.admit's `public`). `metrics`
    (bridges/front_metrics.FrontMetrics, or None: off): every request is counted by the status
    it was answered with (HUNG_UP when the caller left first), and `GET /metrics` is served
    here, after the same checks as any other path: Host, Origin, and the key when the front
    has keys."""

    def __init__(self, app, guard: FrontGuard, error_shape: ErrorShape,
                 turn_paths: Collection[str] = (), max_body: int = Limits.max_body,
                 public_paths: Collection[str] = (), metrics: Any = None):
        self.app, self.guard, self.error_shape = app, guard, error_shape
        self.turn_paths, self.max_body = set(turn_paths), max_body
        self.public_paths = set(public_paths)
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.metrics is None:
            await self._guarded(scope, receive, send)
            return
        answered: list = []

        async def counted(message) -> None:
            if message["type"] == "http.response.start" and not answered:
                answered.append(message["status"])
            await send(message)
        try:
            await self._guarded(scope, receive, counted)
        finally:
            self.metrics.request(answered[0] if answered else HUNG_UP)

    async def _guarded(self, scope, receive, send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}
        peer = str((scope.get("client") or ("?",))[0])
        has_body = scope["method"] in ("POST", "PUT", "PATCH")
        public = scope["method"] == "GET" and scope["path"] in self.public_paths
        caller, refusal = self.guard.admit(headers, peer, has_body, public)
        # admit() names a caller ("" for the anonymous one) whenever it refuses nothing
        caller = caller if caller is not None else ""
        if refusal is None and has_body:
            read, refusal = await read_body(receive, headers, self.max_body)
            if read is None and refusal is None:
                return                      # gone before its body arrived
            body = read or b""
        else:
            body = b""
        turn = refusal is None and has_body and scope["path"] in self.turn_paths
        if turn:
            refusal = self.guard.begin_turn(caller)
            turn = refusal is None
        if refusal is not None:
            await self.refuse(refusal, peer, send, close=has_body)
            return
        if self.metrics is not None and scope["path"] == METRICS_PATH:
            await self._metrics(scope, headers, send)
            return
        try:
            await self._run(scope, caller, body, receive, send, peer)
        finally:
            if turn:
                self.guard.end_turn(caller)

    async def _metrics(self, scope, headers: Dict[str, str], send) -> None:
        """The metrics to an admitted caller, in the format its Accept asks for."""
        if scope["method"] != "GET":
            await self.refuse(Refusal(405, "only GET is answered at /metrics",
                                      "method_not_allowed"), "", send, close=False)
            return
        body, content_type = self.metrics.exposition(headers.get("accept", ""))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type.encode("latin-1")),
                                (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": body})

    async def refuse(self, refusal: Refusal, peer: str, send, close: bool) -> None:
        log = LOG.debug if refusal.status == 429 else LOG.info
        log(f"refused a request from {peer}: {refusal.status} {refusal.code}")
        payload = json.dumps(self.error_shape(refusal)).encode()
        await send({"type": "http.response.start", "status": refusal.status,
                    "headers": _refusal_headers(refusal, close)})
        await send({"type": "http.response.body", "body": payload})

    async def _run(self, scope, caller: str, body: bytes, receive, send, peer: str) -> None:
        """The app, with the body read, cancelled as soon as the caller hangs up."""
        gone = asyncio.Event()
        scope = dict(scope, **{CALLER: caller})
        handed: list = []

        async def replay():
            if not handed:
                handed.append(True)
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
        app = asyncio.ensure_future(self.app(scope, replay, send))
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({app, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            app.cancel()
            raise
        finally:
            watcher.cancel()
        if app.done():
            app.result()
            return
        LOG.info(f"{peer} hung up: its request was stopped")
        app.cancel()
        await asyncio.gather(app, return_exceptions=True)


async def read_body(receive, headers: Dict[str, str],
                    limit: int) -> Tuple[Optional[bytes], Optional[Refusal]]:
    """The request body, refused (413) as soon as more than `limit` bytes are announced or
    have arrived; (None, None) when the caller hung up first."""
    too_large = Refusal(413, f"the request body is over {limit} bytes", "body_too_large")
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        return None, too_large
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), None


class _RequestDeadline:
    """Mixed into uvicorn's h11 protocol (guarded_protocol): a deadline while the peer owes us
    a request's headers or body, none while the app answers; when it passes, the connection
    is closed, so a slow or idle peer holds no connection longer than `_read_timeout`
    without sending."""
    _deadline: Optional[asyncio.TimerHandle] = None
    _deadline_for: Any = None
    _read_timeout: float              # guarded_protocol's limits.read_timeout
    _owing: Tuple[Any, ...] = ()      # h11's states of a peer that owes us bytes
    conn: Any                         # H11Protocol's
    loop: Any
    transport: Any
    _peer: str

    def _track(self) -> None:
        state = self.conn.their_state
        if state is self._deadline_for:
            return
        self._deadline_for = state
        self._arm(self._read_timeout if state in self._owing else None)

    def _arm(self, seconds: Optional[float]) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None if seconds is None else \
            self.loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            LOG.debug(f"closed a connection from {self._peer}: no request within "
                      f"{self._read_timeout} s")
            self.transport.close()


def guarded_protocol(limits: Limits):
    """uvicorn's h11 protocol with the connection caps and read deadlines of `limits`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol
    peers = PeerGate(allow=None, caps=Caps(connections=limits.max_connections,
                                           connections_per_peer=limits.max_per_peer))

    class GuardedH11Protocol(_RequestDeadline, H11Protocol):
        _refused = True
        _read_timeout = limits.read_timeout
        _owing = (h11.IDLE, h11.SEND_BODY)

        def connection_made(self, transport) -> None:
            self._peer = str((transport.get_extra_info("peername") or ("?",))[0])
            if peers.admit(self._peer) is not None:
                LOG.debug(f"refused a connection from {self._peer}: over the cap")
                transport.close()
                return
            self._refused = False
            super().connection_made(transport)
            self._track()

        def connection_lost(self, exc) -> None:
            if self._refused:
                return
            self._refused = True
            peers.release(self._peer)
            self._arm(None)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._track()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._track()

    return GuardedH11Protocol


async def serve(app, host: str, port: int, limits: Limits = Limits(), lifespan: Any = "off",
                started: Optional[Callable[[Any], Any]] = None,
                stopping: Optional[asyncio.Event] = None) -> None:
    """Serve `app` (already a GuardedApp) until `stopping` is set (bridges/serving's stop
    signal: no new connections, idle ones closed, the requests in flight finish) or the
    server is told to exit (`started` gets the uvicorn.Server), or until cancelled."""
    import uvicorn
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan,
                            access_log=False, server_header=False,
                            http=guarded_protocol(limits),
                            # the cap is the guarded protocol's: uvicorn's own answers
                            # 503 once as many connections are open as it allows, so
                            # a full cap of admitted connections got 503 on every request
                            limit_concurrency=limits.max_connections + 1,
                            timeout_keep_alive=max(1, int(limits.keep_alive)))
    server = _ServerWithoutSignals(config)
    if started is not None:
        started(server)
    watch = asyncio.ensure_future(_exit_when(stopping, server)) if stopping else None
    try:
        await server.serve()
    finally:
        if watch is not None:
            watch.cancel()


async def _exit_when(stopping: asyncio.Event, server) -> None:
    await stopping.wait()
    server.should_exit = True           # uvicorn's own graceful shutdown


def _ServerWithoutSignals(config):
    """uvicorn.Server leaving SIGINT and SIGTERM to bridges/serving: uvicorn would take them
    in the main thread for its own shutdown and raise them again after it."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):          # uvicorn >= 0.29
            yield

        def install_signal_handlers(self) -> None:      # uvicorn < 0.29
            pass

    return Server(config)


def guard_from_cli(args, host: str, what: str) -> FrontGuard:
    """The guard of an HTTP front from its command line (bridges/serving's keys and
    exposure check, add_limit_options' lists); ConfigurationError for what does not do."""
    from hivemind_chat_agent.bridges import serving
    from hivemind_chat_agent.errors import ConfigurationError
    keys = serving.read_keys(args.api_key, args.api_key_file)
    serving.check_exposure(host, keys)
    try:
        return FrontGuard(host, keys, args.allowed_host, args.allowed_origin,
                          turns_per_caller=args.turns_per_caller, what=what)
    except ValueError as e:
        raise ConfigurationError(f"--allowed-origin: {e}") from None
