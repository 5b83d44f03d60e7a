"""A TCP proxy that injects faults into a websocket stream, one RFC 6455 frame at a time.

Why: a genuine hub never sends a forged, corrupted, lost or stalled frame, so the client's
handling of those can only be tested by something between the two that an attacker or a bad
network could be. `FaultProxy(hub_port)` listens on 127.0.0.1 (`.port`) and forwards bytes both
ways. Client -> hub bytes pass untouched (they are masked and encrypted anyway). Hub -> client,
after the HTTP upgrade response, the stream is split into whole frames (FIN/opcode, 7/16/64-bit
length; a server's frames are unmasked) and each is forwarded only once it is complete, so a
fault switched on at runtime hits exactly one frame and everything between frames is a boundary:

* `inject_plaintext(x)`  an extra unmasked text frame (str/dict payload, or raw frame bytes)
* `corrupt_next(mode)`   the next data frame: "auth" swaps one character of its ciphertext for
                         another of the same alphabet (decodes fine, fails authentication);
                         "garbage" overwrites the payload with invalid UTF-8; "text" with
                         printable non-JSON text. The length, hence the framing, is kept.
* `drop_next()`          swallows the next data frame
* `blackhole(after)`     holds everything, both ways, sockets left open (a partition: TCP keeps
                         the bytes, they flow again on `heal()`); `after=N` first lets N more
                         hub -> client data frames through
* `delay(seconds)`       holds each hub -> client frame that long, in order
* `heal()`               ends the faults above (an armed corrupt/drop is disarmed)
* `cut()`                ends every connection open now, both ways (a peer that went away)

`skip=N` on corrupt/drop lets N data frames through first. `frames` lists what happened to each
hub -> client data frame: ("sent" | "dropped" | "corrupted" | "injected", opcode, length).
"""
import json
import select
import socket
import threading
import time

DATA_OPCODES = (0x0, 0x1, 0x2)
B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
HEX = b"0123456789abcdef"
PAST = {"sent": "sent", "drop": "dropped", "corrupt": "corrupted"}


def text_frame(payload: bytes) -> bytes:
    """One unmasked, final text frame, as a server writes it."""
    n = len(payload)
    size = (bytes([n]) if n < 126 else bytes([126]) + n.to_bytes(2, "big") if n < 1 << 16
            else bytes([127]) + n.to_bytes(8, "big"))
    return b"\x81" + size + payload


def split_frame(buf: bytes):
    """(frame, header length, rest) for the first complete frame of `buf`, else (None, 0, buf)."""
    if len(buf) < 2:
        return None, 0, buf
    n, start = buf[1] & 0x7F, 2
    if n >= 126:
        start = 4 if n == 126 else 10
        if len(buf) < start:
            return None, 0, buf
        n = int.from_bytes(buf[2:start], "big")
    start += 4 if buf[1] & 0x80 else 0      # masked: never from a server, but keep in step
    if len(buf) < start + n:
        return None, 0, buf
    return buf[:start + n], start, buf[start + n:]


def corrupt(payload: bytes, mode: str) -> bytes:
    if mode == "garbage":
        return b"\xff\xfe" * (len(payload) // 2) + b"\xff" * (len(payload) % 2)
    if mode == "text":
        return b"#" * len(payload)
    mark = b'"ciphertext": "'
    start = payload.find(mark) + len(mark) if mark in payload else 0
    end = payload.find(b'"', start) if mark in payload else len(payload)
    value = payload[start:end]
    alphabet = HEX if value and all(c in HEX for c in value) else B64
    i = start + (end - start) // 2     # mid-value: every bit of it counts (not the padding)
    c = payload[i]
    swap = alphabet[(alphabet.index(c) + 1) % len(alphabet)] if c in alphabet else ord("A")
    return payload[:i] + bytes([swap]) + payload[i + 1:]


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self._target = (target_host, target_port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self._cv = threading.Condition()
        self._closed = self._blackholed = False
        self._delay = 0.0
        self._fault = None            # [action, frames to let through first]
        self._inject = []             # whole frames waiting for the next boundary
        self._socks, self._threads = [], []
        self.connections = 0
        self.frames = []
        self._spawn(self._accept)

    @property
    def port(self) -> int:
        return self._server.getsockname()[1]

    # ---- switches (any thread) ----
    def inject_plaintext(self, frame_bytes_or_text) -> None:
        x = frame_bytes_or_text
        x = json.dumps(x) if isinstance(x, dict) else x
        with self._cv:
            self._inject.append(text_frame(x.encode()) if isinstance(x, str) else bytes(x))

    def corrupt_next(self, mode: str = "auth", skip: int = 0) -> None:
        assert mode in ("auth", "garbage", "text")
        self._arm("corrupt:" + mode, skip)

    def drop_next(self, skip: int = 0) -> None:
        self._arm("drop", skip)

    def blackhole(self, after: int = 0) -> None:
        if after:
            self._arm("blackhole", after)
        else:
            with self._cv:
                self._blackholed = True

    def delay(self, seconds: float) -> None:
        with self._cv:
            self._delay = seconds

    def heal(self) -> None:
        with self._cv:
            self._blackholed, self._delay, self._fault = False, 0.0, None
            self._cv.notify_all()

    def cut(self) -> None:
        self._end(*self._socks)

    @property
    def threads_alive(self) -> int:
        """How many of the proxy's threads still run (0 once close() has returned cleanly)."""
        return sum(t.is_alive() for t in self._threads)

    def _arm(self, action: str, skip: int) -> None:
        with self._cv:
            self._fault = [action, skip]

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(5)
        for s in [self._server] + self._socks:
            s.close()

    # ---- threads ----
    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True,
                             name=f"fault-proxy-{target.__name__}")
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._closed:
            if not select.select([self._server], [], [], 0.05)[0]:
                continue
            client, _ = self._server.accept()
            try:
                hub = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, hub):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [client, hub]
            self.connections += 1
            self._spawn(self._upstream, client, hub)
            self._spawn(self._downstream, hub, client)

    def _recv(self, src):
        """Bytes, b"" for nothing yet (or held), None once the pair is over."""
        with self._cv:
            if self._closed:
                return None
            if self._blackholed:
                self._cv.wait(0.05)
                return b""
        if not select.select([src], [], [], 0.05)[0]:
            return b""
        try:
            return src.recv(65536) or None
        except OSError:
            return None

    def _upstream(self, src, dst) -> None:
        while (data := self._recv(src)) is not None:
            if not self._send(dst, data):
                break
        self._end(src, dst)

    def _downstream(self, src, dst) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:                      # the HTTP upgrade response
            if (data := self._recv(src)) is None:
                return self._end(src, dst)
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        if not self._send(dst, head + b"\r\n\r\n"):
            return self._end(src, dst)
        while True:
            with self._cv:
                injected, self._inject = ([], self._inject) if self._blackholed else \
                    (self._inject, [])
            for frame in injected:
                self.frames.append(("injected", frame[0] & 0x0F, len(frame)))
                self._send(dst, frame)
            frame, start, buf = split_frame(buf)
            if frame is None:
                if (data := self._recv(src)) is None:
                    break
                buf += data
            elif not self._forward(dst, frame, start):
                break
        self._end(src, dst)

    def _forward(self, dst, frame: bytes, start: int) -> bool:
        opcode, action = frame[0] & 0x0F, "sent"
        with self._cv:
            if opcode in DATA_OPCODES and self._fault is not None:
                if self._fault[1] > 0:
                    self._fault[1] -= 1
                else:
                    action, self._fault = self._fault[0], None
            if action == "blackhole":
                self._blackholed, action = True, "sent"
            deadline = time.monotonic() + self._delay     # heal() and close() notify
            while not self._closed and (self._blackholed or time.monotonic() < deadline):
                self._cv.wait(None if self._blackholed else deadline - time.monotonic())
            if self._closed:
                return False
        if opcode in DATA_OPCODES:
            self.frames.append((PAST[action.split(":")[0]], opcode, len(frame) - start))
        if action == "drop":
            return True
        if action.startswith("corrupt:"):
            frame = frame[:start] + corrupt(frame[start:], action.split(":")[1])
        return self._send(dst, frame)

    @staticmethod
    def _send(dst, data: bytes) -> bool:
        try:
            return dst.sendall(data) is None
        except OSError:
            return False

    @staticmethod
    def _end(*socks) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
