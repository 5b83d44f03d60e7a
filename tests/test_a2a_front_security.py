"""`hivemind-chat a2a`'s HTTP edge tried as an attacker would, as tests/test_front_security.py
tries the OpenAI front: the real app (bridges/a2a_http.guarded_app, the a2a-sdk's routes)
served by bridges/http_front.serve on loopback, raw sockets where a client library would not
send what an attacker does. No hub: the agent behind it speaks only when the test says
(`HeldAgent`), so nothing here depends on how fast the machine is; the real-hub run is
tests/test_a2a_server.py."""
import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
import uuid

import pytest
from fronts import until
from hubs import free_port, wait_listening

from hivemind_chat_agent.bridges import a2a_http, a2a_server, http_front
from hivemind_chat_agent.core.front_guard import FrontGuard, Keys
from hivemind_chat_agent.core.outcomes import TurnStatus


class HeldTurn:
    """A ChatTurn's asyncio side that says "held" and then waits until terminated."""

    def __init__(self):
        self.status = TurnStatus.SPEAKING
        self.terminated = threading.Event()
        self.said = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.said:
            self.said = True
            return "held"
        while not self.terminated.is_set():
            await asyncio.sleep(0.01)
        self.status = TurnStatus.CANCELLED
        raise StopAsyncIteration

    def get_exception(self):
        return None

    def terminate(self):
        self.terminated.set()


class SaidTurn(HeldTurn):
    """A turn that says `words` and ends answered."""

    def __init__(self, words):
        super().__init__()
        self.words = [words]

    async def __anext__(self):
        if self.words:
            return self.words.pop()
        self.status = TurnStatus.ANSWERED
        raise StopAsyncIteration


class HeldAgent:
    """`abegin` as HiveMindChatAgent's: every turn a HeldTurn ("say WORDS": a SaidTurn),
    kept in `turns`."""

    def __init__(self):
        self.turns = []

    async def abegin(self, messages, session_id):
        text = messages[-1]["content"]
        turn = SaidTurn(text[4:]) if text.startswith("say ") else HeldTurn()
        self.turns.append(turn)
        return turn


@contextlib.contextmanager
def served(keys=(), limits=http_front.Limits(), book=None, turns_per_caller=64):
    """The A2A app behind its guard on a free loopback port, in a thread of its own; yields
    (port, agent). `book`: the TaskBook behind its task store."""
    agent, port = HeldAgent(), free_port()
    guard = FrontGuard("127.0.0.1", Keys(keys), what="A2A server",
                       turns_per_caller=turns_per_caller)
    app = a2a_http.guarded_app(agent, guard, f"http://127.0.0.1:{port}/", limits, book)
    loop, stopping = asyncio.new_event_loop(), asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, daemon=True, args=(
        http_front.serve(app, "127.0.0.1", port, limits, stopping=stopping),))
    thread.start()
    try:
        wait_listening(port, 10, what="the A2A server")
        yield port, agent
    finally:
        loop.call_soon_threadsafe(stopping.set)
        thread.join(10)
        assert not thread.is_alive(), "the A2A server did not stop"
        loop.close()


def send_message(text="hello", method="message/send"):
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": {
        "role": "user", "messageId": uuid.uuid4().hex, "kind": "message",
        "parts": [{"kind": "text", "text": text}]}}}


def post(port, body, headers=None, timeout=10):
    """(status, parsed body) of one JSON-RPC POST sent exactly as given."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", "/", raw, {"Content-Type": "application/json", **(headers or {})})
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    return reply.status, json.loads(data)


def read_status(sock, timeout=5):
    """The status line the server sends, b"" when it closes without one."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n" not in data:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:        # closed with our bytes unread: the same refusal
            break
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


def test_a_foreign_host_or_origin_is_refused_and_nothing_reaches_the_hub():
    """A page rebinding its name to 127.0.0.1, or any page posting from a browser, cannot
    drive the agent: 421 and 403 as JSON-RPC errors, and no turn began."""
    with served() as (port, agent):
        for attack, status, code in (({"Host": "evil.example"}, 421, "host_not_allowed"),
                                     ({"Host": "evil.example:9999"}, 421, "host_not_allowed"),
                                     ({"Origin": "https://attacker.example"}, 403,
                                      "origin_not_allowed"),
                                     ({"Origin": "null"}, 403, "origin_not_allowed")):
            got, body = post(port, send_message(), attack)
            assert (got, body["error"]["data"]["code"]) == (status, code), attack
            assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32001
        got, body = post(port, b"{}", {"Content-Type": "text/plain"})
        assert got == 415
        assert agent.turns == []
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        for origin, status in (("https://attacker.example", 403), ("http://localhost:3000", 200)):
            conn.request("GET", a2a_server.CARD_PATH, headers={"Origin": origin})
            reply = conn.getresponse()
            reply.read()
            assert reply.status == status, origin     # the public card too; a local page may
        conn.close()


def test_the_key_is_checked_before_the_body_is_read():
    """A missing or wrong key announcing a huge body, and never sending it, is refused at
    once (the server does not wait for the body)."""
    with served(keys=["the-key"]) as (port, agent):
        head = ("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {1 << 30}\r\n").encode()
        for key in (b"", b"Authorization: Bearer wrong\r\n"):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(head + key + b"\r\n")
                assert b" 401 " in read_status(sock, 3), key
        assert agent.turns == []


def test_the_default_body_limit_is_one_mebibyte():
    with served() as (port, agent):
        with socket.create_connection(("127.0.0.1", port)) as sock:    # refused unsent
            sock.sendall(("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                          f"application/json\r\nContent-Length: {(1 << 20) + 1}\r\n\r\n"
                          ).encode())
            assert b" 413 " in read_status(sock)
        chunked = ("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                   "\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:    # no length announced
            sock.sendall(chunked)
            with contextlib.suppress(OSError):     # refused before the last chunk is sent
                for _ in range(17):
                    sock.sendall(b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16)))
            assert b" 413 " in read_status(sock)
        assert agent.turns == []
        status, body = post(port, send_message("say " + "x" * ((1 << 20) - 1000)))
        assert status == 200 and body["result"]["status"]["state"] == "completed"


def test_an_oversize_body_is_refused_with_a_clear_error():
    with served(limits=http_front.Limits(max_body=4096)) as (port, agent):
        status, body = post(port, send_message("x" * 10000))
        assert status == 413
        assert body["error"]["data"]["code"] == "body_too_large"
        assert "over 4096 bytes" in body["error"]["message"]
        chunked = ("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:    # no length announced
            sock.sendall(chunked + b"%x\r\n%s\r\n" % (8192, b"x" * 8192))
            assert b" 413 " in read_status(sock)
        assert agent.turns == []


def test_an_idle_connection_is_closed_by_its_deadline_and_connections_are_capped():
    limits = http_front.Limits(read_timeout=1.0, max_connections=4, max_per_peer=2)
    with served(limits=limits) as (port, _agent):
        idle = socket.create_connection(("127.0.0.1", port))
        assert read_status(idle, 5) == b""          # closed, never sent a request
        idle.close()
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        over = socket.create_connection(("127.0.0.1", port))
        over.sendall(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_status(over, 5) == b""          # closed at accept: over the per-peer cap
        for sock in held + [over]:
            sock.close()
        # the places are freed: a new caller is served
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        until(lambda: _card_served(conn), 5, "the card served once the connections closed")


def _card_served(conn) -> bool:
    try:
        conn.request("GET", "/.well-known/agent-card.json")
        return conn.getresponse().status == 200
    except OSError:
        conn.close()
        return False


def test_a_caller_who_hangs_up_on_a_plain_send_stops_its_turn_and_frees_its_place_at_once():
    """`message/send` waits for the whole task: a caller that gives up on it is gone, its turn
    stopped and its place (one per caller here) free at once. The SDK's handler, cancelled,
    waited for the task to end first: the turn went on to its end, the place held so long."""
    with served(turns_per_caller=1) as (port, agent):
        raw = json.dumps(send_message("talk")).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         b"application/json\r\nContent-Length: " + str(len(raw)).encode()
                         + b"\r\n\r\n" + raw)
            until(lambda: agent.turns, 5, "the turn begun")
            assert post(port, send_message("say busy"))[0] == 429     # the one place held
        until(lambda: agent.turns[0].terminated.is_set(), 5,
              "the turn stopped when its caller hung up")
        until(lambda: post(port, send_message("say next"))[0] == 200, 5, "the place free")


def test_a_caller_who_hangs_up_mid_stream_stops_its_turn():
    """A streamed task whose caller closes the connection after the first sentence: the
    turn is terminated (the hub stops) and the caller's place is free again."""
    with served() as (port, agent):
        raw = json.dumps(send_message("talk", method="message/stream")).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         b"application/json\r\nAccept: text/event-stream\r\nContent-Length: "
                         + str(len(raw)).encode() + b"\r\n\r\n" + raw)
            sock.settimeout(5)
            seen = b""
            while b"held" not in seen:
                chunk = sock.recv(4096)
                assert chunk, seen
                seen += chunk
            assert b" 200 " in seen.split(b"\r\n", 1)[0]
        until(lambda: agent.turns and agent.turns[0].terminated.is_set(), 5,
              "the turn stopped when its caller hung up")


def connect_from(address, port):
    sock = socket.socket()
    sock.bind((address, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def is_open(sock) -> bool:
    """Whether the server has not closed `sock` (nothing is read from it)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def card_from(address, port) -> int:
    """The status of GET card on a connection of its own from `address`, 0 when closed."""
    with connect_from(address, port) as sock:
        sock.sendall(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Connection: close\r\n\r\n")
        line = read_status(sock, 5)
    return int(line.split()[1]) if line else 0


@pytest.mark.parametrize("deadline", [1.0, 30.0])
def test_more_connections_than_the_total_cap_from_many_addresses_are_closed_at_accept(
        deadline):
    """Attackers from six loopback addresses, each under the per-peer cap, open three times
    the total cap: the excess is closed at accept; idle ones hold their places until their
    read deadline only (the owner is served then), and every place is free again once the
    attackers leave."""
    cap, per_peer = 8, 4
    limits = http_front.Limits(read_timeout=deadline, max_connections=cap,
                               max_per_peer=per_peer)
    with served(limits=limits) as (port, agent):
        # served once, then a moment: wait_listening's own connection is given back
        assert card_from("127.0.0.1", port) == 200
        time.sleep(0.2)
        attackers = [connect_from(f"127.0.0.{2 + i // per_peer}", port)
                     for i in range(6 * per_peer)]
        until(lambda: sum(map(is_open, attackers)) <= cap, 5, "the excess closed")
        time.sleep(0.2)     # none refused late, none let in late
        assert sum(map(is_open, attackers)) == cap
        if deadline < 5:
            started = time.monotonic()
            until(lambda: card_from("127.0.0.1", port) == 200, deadline + 5,
                  "the owner served while attackers filled the cap")
            assert time.monotonic() - started < deadline + 3
        else:               # a deadline far off: the cap holds against the owner too
            assert card_from("127.0.0.1", port) == 0
        for sock in attackers:
            sock.close()
        # every place given back: the whole cap, from two addresses, served at once (each
        # request on a full cap of admitted connections was a 503 of uvicorn's before)
        until(lambda: card_from("127.0.0.1", port) == 200, 5, "a place free again")
        owners = [connect_from(address, port) for address in ("127.0.0.1", "127.0.0.20")
                  for _ in range(per_peer)]
        for sock in owners:
            sock.sendall(b"GET /.well-known/agent-card.json HTTP/1.1\r\n"
                         b"Host: 127.0.0.1\r\n\r\n")
        assert [read_status(sock) for sock in owners] == [b"HTTP/1.1 200 OK"] * cap
        for sock in owners:
            sock.close()
        assert agent.turns == []
