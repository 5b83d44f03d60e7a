"""The OpenAI and MCP fronts tried as an attacker would (issue 24), on loopback only: real
servers (in-process as `hivemind-chat openai` runs it, or the command itself), genuine hubs of
both generations, raw sockets where a client library would not send what an attacker does."""
import http.client
import json
import os
import socket
import subprocess
import sys
import time

import openai
import pytest
from fronts import Server, running, say, until
from hubs import HubProcess, free_port, plugin_config, wait_listening
from waiting import UNIT, wait_until

from hivemind_chat_agent.bridges.http_front import Limits


@pytest.fixture
def served(creds, make_agent):
    """`hivemind-chat openai` in-process on the session's hub."""
    with running(make_agent(creds.agent_config(timeout=5))) as server:
        yield server

CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
CHAT = "/v1/chat/completions"


def post(port, body, headers=None, path=CHAT, host="127.0.0.1", source=None, timeout=10):
    """(status, parsed body) of one POST sent exactly as given."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, raw, {"Content-Type": "application/json", **(headers or {})})
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    try:
        return reply.status, json.loads(data)
    except ValueError:
        return reply.status, data


def chat(text, user=None):
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if user is not None:
        body["user"] = user
    return body


def answer(reply):
    return reply[1]["choices"][0]["message"]["content"]


def test_a_web_page_can_neither_rebind_nor_post_to_the_hub(served):
    """A CORS-simple POST (text/plain, no preflight) from any page, and a page whose name was
    rebound to 127.0.0.1, reached the hub before: now 415, 403 and 421, and nothing ran."""
    attacks = [{"Host": "evil.example"}, {"Host": "evil.example:8080"},
               {"Origin": "https://attacker.example"}, {"Origin": "null"},
               {"Content-Type": "text/plain"},
               {"Content-Type": "application/x-www-form-urlencoded"}]
    statuses = [post(served.port, chat("remember pwned", user="victim"), attack)[0]
                for attack in attacks]
    assert statuses == [421, 421, 403, 403, 415, 415]
    status, body = post(served.port, chat("remember pwned", user="victim"),
                        {"Origin": "https://attacker.example"})
    assert body["error"]["code"] == "origin_not_allowed" and "--allowed-origin" in \
        body["error"]["message"]
    assert answer(post(served.port, chat("recall", user="victim"))) == "I remember nothing"
    # a page on this machine, and the server's own names, are served
    assert answer(post(served.port, chat("hello"), {"Origin": "http://localhost:3000",
                                                    "Host": f"localhost:{served.port}"})) \
        == "hello there"


def test_allowed_hosts_and_origins_are_served_others_refused(creds, make_agent):
    server = Server(make_agent(creds.agent_config(timeout=5)),
                    allowed_hosts=["hub.lan"], allowed_origins=["https://chat.example.org"])
    try:
        ok = post(server.port, chat("hello"), {"Host": "hub.lan:8080",
                                                "Origin": "https://chat.example.org"})
        assert answer(ok) == "hello there"
        assert post(server.port, chat("hello"), {"Host": "other.lan"})[0] == 421
        assert post(server.port, chat("hello"), {"Origin": "https://chat.example.org.evil"}
                    )[0] == 403
    finally:
        server.stop()


def test_nested_broken_or_foreign_json_is_a_400_not_a_traceback(served):
    for raw in (b"[" * 100000, b'{"messages": [', b"\xff\xfe", b'"a string"', b"[]"):
        status, body = post(served.port, raw)
        assert status == 400, raw[:20]
        assert body["error"]["type"] == "invalid_request_error"
    status, body = post(served.port, {"messages": [{"role": "user", "content": "hi"}]
                                      * 2 + [[[[]]]]})
    assert status == 400


def test_each_key_is_its_own_set_of_conversations(creds, make_agent):
    """One --api-key for everyone let any app reach any other's sessions: now each key is
    a namespace, the same conversation name under two keys two sessions."""
    server = Server(make_agent(creds.agent_config(timeout=5)), api_keys=["key-a", "key-b"])
    try:
        a, b = server.client(api_key="key-a"), server.client(api_key="key-b")
        say(a, "remember ada", user="shared")
        assert say(b, "recall", user="shared") == "I remember nothing"
        assert say(a, "recall", user="shared") == "you said ada"
        with pytest.raises(openai.AuthenticationError):
            say(server.client(api_key="key-c"), "hello")
    finally:
        server.stop()


def test_a_history_ending_at_an_older_answer_forks_and_never_joins_the_live_session(
        served, generation):
    """Knowing a chat's opening exchange joined its live session ("Your name is Alice."):
    now it forks from the state saved at that answer; the live chat goes on as it was.
    (`whoami` answers the session id the hub saw.)"""
    client = served.client()
    told = say(client, "remember ada")
    live = say(client, "remember ada", told, "whoami")
    replayed = say(client, "remember ada", told, "whoami")
    assert replayed != live                     # a session apart, not the live one
    assert say(client, "remember ada", told, "whoami", live, "whoami") == live
    if generation == "5":   # the state at that answer came along (a 4.0 hub takes a new
        # connection's Session from its HELLO)
        assert say(client, "remember ada", told, "recall") == "you said ada"


def read_status(sock, timeout):
    sock.settimeout(timeout)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.fixture
def keyed_command(creds, tmp_path):
    """`hivemind-chat openai` as its own process, its API key in a file and the hub's password
    in the environment (no secret on its command line)."""
    port = free_port()
    keys = tmp_path / "keys"
    keys.write_text("# one key per line\nthe-key\n")
    env = {**os.environ, "HIVEMIND_CHAT_PASSWORD": creds.password}
    proc = subprocess.Popen([CLI, "openai", "--uri", f"http://127.0.0.1:{port}",
                             "--api-key-file", str(keys), "--host", creds.host, "--port",
                             str(creds.port), "--key", creds.key, "--timeout", "5",
                             "--no-store"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    wait_listening(port, 30, proc=proc, what="hivemind-chat openai")
    yield port, proc
    proc.terminate()
    assert b"the-key" not in proc.communicate(timeout=10)[1]


def test_the_key_is_checked_before_the_body_and_bodies_are_capped_as_they_arrive(
        keyed_command):
    port, proc = keyed_command
    assert answer(post(port, chat("hello"), {"Authorization": "Bearer the-key"})) == \
        "hello there"
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:     # no key, no body sent
        sock.sendall(head + b"\r\n")
        assert b" 401 " in read_status(sock, 5)
    before = rss_kib(proc.pid)
    sent, chunk = 0, b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + b"Authorization: Bearer the-key\r\n\r\n")
        try:
            while sent < 300 << 20:
                sock.sendall(chunk)
                sent += 1 << 20
        except OSError:          # refused while it arrived: the server closed its end
            pass
        assert b" 413 " in read_status(sock, 5)
    assert sent < 64 << 20, f"{sent >> 20} MiB went in before the refusal"
    grew = rss_kib(proc.pid) - before
    assert grew < 16 * 1024, f"the server grew by {grew} KiB"
    assert post(port, b"{}", {"Authorization": "Bearer the-key",
                              "Content-Length": str(2 << 20)})[0] in (413, 400)


def test_wrong_keys_from_one_peer_are_slowed_down(keyed_command):
    port, _proc = keyed_command
    wrong = [post(port, chat("hello"), {"Authorization": "Bearer guess"},
                  source="127.0.0.3")[0] for _ in range(30)]
    assert wrong[:10] == [401] * 10 and set(wrong[10:]) == {429}
    # the owner, from another address, is not slowed down
    assert answer(post(port, chat("hello"), {"Authorization": "Bearer the-key"})) == \
        "hello there"


@pytest.fixture
def short_deadlines(creds, make_agent):
    server = Server(make_agent(creds.agent_config(timeout=5)),
                    limits=Limits(read_timeout=1.0, max_connections=64, max_per_peer=8,
                                  keep_alive=1.0))
    yield server
    server.stop()


def closed_within(sock, seconds):
    """Seconds until the server closed `sock`, or None if it is still open after `seconds`."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return None
    except OSError:
        pass
    return time.monotonic() - start


def test_slow_and_idle_connections_are_closed_within_their_deadline(short_deadlines):
    port = short_deadlines.port
    idle = socket.create_connection(("127.0.0.1", port))
    half_header = socket.create_connection(("127.0.0.1", port))
    half_header.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    slow_body = socket.create_connection(("127.0.0.1", port))
    slow_body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a")
    for sock in (idle, half_header, slow_body):
        took = closed_within(sock, 4)
        assert took is not None and took < 4
        sock.close()
    # a kept-alive connection idle after its answer goes too
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", "/v1/models")
    conn.getresponse().read()
    assert closed_within(conn.sock, 4) is not None


def test_many_idle_connections_of_one_peer_do_not_starve_a_real_request(short_deadlines):
    port = short_deadlines.port
    hogs = []
    for _ in range(200):
        sock = socket.socket()
        sock.bind(("127.0.0.2", 0))
        sock.connect(("127.0.0.1", port))
        hogs.append(sock)
    started = time.monotonic()
    assert answer(post(port, chat("hello"))) == "hello there"
    assert time.monotonic() - started < 1.0 + 3 * UNIT    # the hogs' read_timeout, no more
    still_open = [s for s in hogs if closed_within(s, 0.05) is None]
    assert len(still_open) <= 8           # the rest were closed at accept
    for sock in hogs:
        sock.close()


HUB_TIMEOUT = 30     # seconds the talking hub lets an engine answer


@pytest.fixture(scope="module")
def talking_hub(request):
    """A hub running our plugin with tests/engines.py's ScriptEngine ("talk" answers slowly
    until stopped), both generations."""
    hub = HubProcess(plugin_config(timeout=HUB_TIMEOUT, workers=4),
                     generation=request.param).start()
    yield hub
    hub.cleanup()


@pytest.mark.hub
@pytest.mark.parametrize("talking_hub", ["4.0", "5"], indirect=True)
def test_abandoned_requests_stop_their_turns_and_free_the_hub(talking_hub, make_agent):
    """40 callers that hung up after 0.2 s kept the hub busy for everyone for 30 s and more;
    now each hang-up stops its turn, and the next caller is answered at once."""
    # churn_guard 0: our plugin, not the stock 4.0 one, needs no spacing of connects; on 4.0
    # each conversation has a connection of its own, so the next caller's is opened first
    agent = make_agent(talking_hub.add_client().agent_config(
        timeout=30, churn_guard=0, max_connections=64))
    server = Server(agent)
    try:
        assert answer(post(server.port, chat("hello", user="next caller"))) == "hello there"
        body = json.dumps(chat("talk 100 1")).encode()
        abandoned = []
        for _ in range(40):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body)
            abandoned.append(sock)
        until(lambda: len(server.guard.in_flight) == 40, 10, "the 40 requests admitted")
        for sock in abandoned:
            sock.close()
        until(lambda: len(server.guard.in_flight) == 0, 10,
              "every abandoned request freed its place")
        started = time.monotonic()
        assert answer(post(server.port, chat("hello", user="next caller"))) == "hello there"
        # answered before the hub's timeout (30 s) could have freed a worker: an abandoned
        # turn that went on held one of the 4 that long (the clock discerns 30 s from the
        # 1-4 s a loaded machine takes here; it could not tell the 4 s below from them)
        assert time.monotonic() - started < HUB_TIMEOUT / 3
        # on 4.0 each abandoned conversation had begun a connection of its own: those
        # connects are dropped or aborted (client/abandonment.py), not finished (they held
        # the next caller 4 s, and left the pool a connection each: 25 against 2 or 3, a
        # connect that ended just before its caller hung up; 5.x shares up to 4)
        assert len(agent.pool) < 10, len(agent.pool)
        probe = make_agent(talking_hub.add_client().agent_config(timeout=10))
        # none goes on: each is stopped (a stop reaches its engine a moment after the hang-up),
        # long before the hub's timeout would end it
        assert wait_until(lambda: probe.get_response("talking", session_id="probe") == "0",
                          HUB_TIMEOUT / 3, poll=0.1)
        # the probe's own place is given back just after its answer
        until(lambda: len(server.guard.in_flight) == 0, 1, "the next caller's place back")
    finally:
        server.stop()


def mcp_command(creds, uri, *extra, env=None):
    proc = subprocess.Popen([CLI, "mcp", "--http", uri, *extra, "--host", creds.host,
                             "--port", str(creds.port), "--key", creds.key, "--password",
                             creds.password, "--timeout", "5", "--no-store"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    return proc


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "attacker", "version": "1"}}}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}


def test_mcp_on_any_loopback_address_checks_host_and_origin(creds):
    """The SDK checked Host and Origin only when bound to 127.0.0.1, localhost or ::1: on
    127.0.0.2 an evil Host and Origin ran `ask`."""
    port = free_port()
    proc = mcp_command(creds, f"http://127.0.0.2:{port}")
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat mcp", host="127.0.0.2")
        for attack, refused in (({"Host": "evil.example"}, 421),
                                ({"Origin": "https://attacker.example"}, 403),
                                ({"Content-Type": "text/plain"}, 415)):
            status, _ = post(port, INITIALIZE, {**MCP_ACCEPT, **attack}, path="/mcp",
                             host="127.0.0.2")
            assert status == refused, attack
        status, _ = post(port, INITIALIZE, MCP_ACCEPT, path="/mcp", host="127.0.0.2")
        assert status == 200
        for raw in (b"[" * 100000, b'{"a":' * 5000 + b"1" + b"}" * 5000, b"{broken"):
            assert post(port, raw, MCP_ACCEPT, path="/mcp", host="127.0.0.2")[0] == 400
    finally:
        proc.terminate()
        assert b"Traceback" not in proc.communicate(timeout=10)[1]


def test_mcp_off_loopback_needs_a_key_and_refuses_requests_without_it(creds):
    port = free_port()
    refused = mcp_command(creds, f"http://0.0.0.0:{port}")
    assert refused.wait(30) == 2
    assert b"--api-key" in refused.stderr.read()
    proc = mcp_command(creds, f"http://0.0.0.0:{port}", env={"HIVEMIND_CHAT_API_KEY": "mk"})
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat mcp")
        status, body = post(port, INITIALIZE, MCP_ACCEPT, path="/mcp")
        assert status == 401 and body["error"]["data"]["code"] == "invalid_api_key"
        status, _ = post(port, INITIALIZE, {**MCP_ACCEPT, "Authorization": "Bearer mk"},
                         path="/mcp")
        assert status == 200
        _ask_with_key(port, "mk")
    finally:
        proc.terminate()
        proc.wait(10)


def _ask_with_key(port, key):
    """The SDK's own client, with the key, asks; a name past the bound is a tool error."""
    import asyncio

    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async def main():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        async with http, Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp",
                                                       http_client=http)) as client:
            told = await client.call_tool("ask", {"utterance": "hello"})
            assert told.content[0].text == "hello there"
            for name in ("x" * 300_000, "ö" * 101):          # 202 bytes of UTF-8
                long = await client.call_tool("ask", {"utterance": "hello",
                                                      "conversation": name})
                assert long.is_error and "at most 200 bytes" in long.content[0].text
            named = await client.call_tool("ask", {"utterance": "hello",
                                                   "conversation": "ö" * 100})
            assert named.content[0].text == "hello there"
    asyncio.run(asyncio.wait_for(main(), 60))


def mcp_tool_call(utterance):
    """A tools/call request of the 2026-07-28 protocol, as raw bytes (no client library: an
    attacker's or a crashed client's connection just drops)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "ask", "arguments": {"utterance": utterance},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()
    return (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28"
            f"\r\nMcp-Method: tools/call\r\nMcp-Name: ask\r\nContent-Length: {len(body)}"
            "\r\n\r\n").encode() + body


@pytest.mark.hub
@pytest.mark.parametrize("talking_hub", ["5"], indirect=True)
def test_an_mcp_caller_that_hangs_up_stops_its_turn_at_the_hub(talking_hub, make_agent):
    """The engine's long answer ("talk": a sentence a second for 100 s) is stopped within a
    moment of the caller dropping its connection."""
    creds = talking_hub.add_client()
    port = free_port()
    proc = mcp_command(creds, f"http://127.0.0.1:{port}")
    probe = make_agent(talking_hub.add_client().agent_config(timeout=10))
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat mcp")
        before = len(json.loads(probe.get_response("stops", session_id="probe")))
        talking = lambda: probe.get_response("talking", session_id="probe")   # noqa: E731
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(mcp_tool_call("talk 100 1"))
            until(lambda: talking() == "1", 10, "the long answer begun", every=0.05)
        # hung up mid-answer: the hub is told to stop it
        stopped = lambda: any(kind == "stop_session" for kind, _ in json.loads(  # noqa: E731
            probe.get_response("stops", session_id="probe"))[before:])
        until(stopped, 3, "the turn stopped at the hub", every=0.1)
    finally:
        proc.terminate()
        proc.wait(10)
