"""The hub plugin's health endpoint: `GET /healthz`, `/readyz` and `/metrics` on the `health`
address, served by a thread of its own so that neither hivemind-core's IO loop nor the engine's
workers ever wait on a scraper, and a broken engine or store cannot silence the endpoint that
reports them.

Thin on purpose: a stdlib socketserver, one request per connection (`Connection: close`), the
request head read by hand so that the whole of it must arrive within DEADLINE seconds (a
client trickling a byte at a time is cut when the deadline passes, which the stdlib's per-read
timeout would not do) and within MAX_HEAD bytes. Who gets an answer is decided without I/O by
core/health.refusal (GET of three paths, the Host of a loopback bind, no web page) and, at
accept, core/peer_gate.PeerGate: peers outside the allow list (loopback only, unless the
operator named networks in `health_allow_from`) and connections beyond the caps are closed
before a byte is read.

`stop()` closes the listening socket, cuts the connections still open and joins every thread
it started: a plugin shut down leaves no port and no thread behind.
"""
import json
import selectors
import socket
import socketserver
import threading
import time
from http import HTTPStatus
from typing import Any, Callable, Dict, Optional, Set, Tuple

from ovos_utils.log import LOG

from hivemind_chat_agent.core.health import HEALTHZ, READYZ, Verdict, as_asked, refusal
from hivemind_chat_agent.core.peer_gate import AllowList, Caps, PeerGate, is_loopback_bind

DEADLINE = 5.0        # seconds for a whole request head, and again for writing the answer
MAX_HEAD = 8192       # bytes of request line and headers
CAPS = Caps(connections=16, connections_per_peer=8)   # a scraper and a balancer need few


def _response(status: int, body: bytes, content_type: str,
              extra: Tuple[str, ...] = ()) -> bytes:
    phrase = HTTPStatus(status).phrase
    head = [f"HTTP/1.1 {status} {phrase}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", "Connection: close", "Cache-Control: no-store",
            *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _json(verdict: Verdict, body: Optional[Dict[str, Any]] = None) -> bytes:
    extra = ("Allow: GET",) if verdict.status == 405 else ()
    payload = json.dumps(body if body is not None else verdict.body()).encode()
    return _response(verdict.status, payload, "application/json", extra)


def read_head(sock: socket.socket, deadline: float) -> Optional[bytes]:
    """The request head (up to the blank line) if it all arrives before `deadline` (a
    monotonic time) and within MAX_HEAD bytes; None otherwise (the caller closes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or len(data) > MAX_HEAD:
            return None
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(1024)
        except (socket.timeout, OSError):
            return None
        if not chunk:
            return None
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    return head if len(head) <= MAX_HEAD else None


def parse_head(head: bytes) -> Optional[Tuple[str, str, Dict[str, str]]]:
    """(method, target, headers with lower-case names), or None for a malformed head."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1."):
        return None
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            return None
        headers[name.strip().lower()] = value.strip()
    return method, target, headers


class HealthServer:
    """The endpoint on `host`:`port`. `ready()` gives /readyz's verdict (core/health.readiness);
    `metrics(accept)` the exposition and its content type. Start with `start()`."""

    def __init__(self, host: str, port: int, ready: Callable[[], Verdict],
                 metrics: Callable[[str], Tuple[bytes, str]], allow: AllowList,
                 caps: Caps = CAPS, deadline: float = DEADLINE):
        self.ready, self.metrics, self.deadline = ready, metrics, deadline
        self.loopback = is_loopback_bind(host)
        self._gate = PeerGate(allow, caps)
        self._lock = threading.Lock()
        self._open: Set[socket.socket] = set()
        self._server = _Server((host, port), self)
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> Tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> "HealthServer":
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread = threading.Thread(target=self._accept, daemon=True,
                                        name="hivemind-chat-health")
        self._thread.start()
        return self

    def _accept(self) -> None:
        """Sleep until a connection or `stop()` arrives. Not socketserver's serve_forever:
        it wakes every poll_interval to look for a shutdown, which in a hub busy with turns
        cost a GIL hand-off each time (an idle endpoint used 1.3 ms of CPU a second at 0.2 s)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._server.socket, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_reader in ready:
                    return
                self._server.handle_request()    # readable: accepts without waiting

    def stop(self) -> None:
        """Stop accepting, cut open connections, join every thread; idempotent."""
        if self._thread is not None:
            self._wake_writer.send(b"x")
            self._thread.join()
            self._thread = None
            self._wake_reader.close()
            self._wake_writer.close()
        with self._lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._server.server_close()      # block_on_close: joins the connection threads

    # ---- the server's threads ----
    def admit(self, sock: socket.socket, peer: str) -> bool:
        with self._lock:
            if self._gate.admit(peer) is not None:
                return False
            self._open.add(sock)
            return True

    def release(self, sock: socket.socket, peer: str) -> None:
        with self._lock:
            self._gate.release(peer)
            self._open.discard(sock)

    def serve(self, sock: socket.socket) -> None:
        """One request on `sock`, answered within the deadline or cut."""
        deadline = time.monotonic() + self.deadline
        head = read_head(sock, deadline)
        if head is None:
            return
        parsed = parse_head(head)
        answer = _json(Verdict(400, "bad_request", "not an HTTP/1.x request")) \
            if parsed is None else self.answer(*parsed)
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock.sendall(answer)
        except OSError:
            pass

    def answer(self, method: str, target: str, headers: Dict[str, str]) -> bytes:
        refused = refusal(method, target, headers, self.loopback)
        if refused is not None:
            return _json(refused)
        path = target.split("?", 1)[0]
        if path == HEALTHZ:
            return _json(Verdict(200), {"alive": True})
        if path == READYZ:
            return _json(as_asked(self.ready(), target))
        try:
            body, content_type = self.metrics(headers.get("accept", ""))
        except Exception as e:     # a gauge's callback broke: say so, keep serving
            LOG.warning(f"metrics could not be collected: {type(e).__name__}: {e}")
            return _json(Verdict(500, "metrics_failed", type(e).__name__))
        return _response(200, body, content_type)


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """A thread per admitted connection (at most CAPS.connections), joined at close."""
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True
    timeout = 1.0     # handle_request's wait, were a connection seen ready gone at accept

    def __init__(self, address: Tuple[str, int], edge: HealthServer):
        self.edge = edge
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.edge.admit(request, str(client_address[0]))

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.edge.release(request, str(client_address[0]))


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.edge.serve(self.request)
