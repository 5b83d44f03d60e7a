"""`hivemind-chat wyoming` tried as an attacker on the LAN would (issue 24), from loopback
addresses only: Wyoming has no authentication, so who may connect is the allow list, and what
one peer may hold is capped.

Driven with raw sockets bound to chosen source addresses (127.0.0.2, 127.0.0.3, ...) and the
real `wyoming` library's event reader and writer; the turns behind it run on genuine
hivemind-core hubs (the OVOS-like test pipeline, and our plugin with tests/engines.py's slow,
stoppable "talk" engine for the hang-ups). Deadlines are shortened so the tests run in seconds.
"""
import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from home_assistant import turn
from hubs import HubProcess, free_port, plugin_config
from waiting import UNIT, hold_still, wait_until
from wyoming.asr import Transcript
from wyoming.event import async_read_event, async_write_event
from wyoming.handle import Handled, NotHandled
from wyoming.info import Describe, Info

from hivemind_chat_agent.bridges.wyoming_events import Deadlines
from hivemind_chat_agent.bridges.wyoming_server import (
    SPOKEN,
    AllowList,
    Guard,
    PeerGate,
    WyomingBridge,
    run_server,
)
from hivemind_chat_agent.core.peer_gate import Caps

CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")


class Served:
    """run_server with a guard of the test's, on an event loop of its own thread."""

    def __init__(self, agent, allow=(), caps=Caps(), deadlines=Deadlines(), turn_wait=5.0,
                 host="127.0.0.1"):
        self.port = free_port()
        gate = PeerGate(AllowList.for_bind(host, allow, "the Wyoming server", "x"), caps)
        self.guard = Guard(gate, deadlines, turn_wait=turn_wait)
        self.bridge = WyomingBridge(agent, version="test")
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(host, started), daemon=True)
        self.thread.start()
        assert started.wait(10), "the Wyoming server did not start"

    def _run(self, host, started):
        asyncio.set_event_loop(self.loop)
        ready = self.loop.create_future()
        ready.add_done_callback(lambda _: started.set())
        self.task = self.loop.create_task(run_server(self.bridge, host, self.port, ready,
                                                     guard=self.guard))
        try:
            self.loop.run_until_complete(self.task)
        except asyncio.CancelledError:
            pass

    def stop(self):
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(5)


@pytest.fixture
def servers():
    started = []

    def serve(*args, **kw):
        server = Served(*args, **kw)
        started.append(server)
        return server
    yield serve
    for server in started:
        server.stop()


@pytest.fixture
def logged():
    """Every record our package and asyncio log during the test (asyncio is where an
    exception escaping a connection's handler would land, with its traceback)."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)
    handler, root, kept = Keep(logging.DEBUG), logging.getLogger(), []
    root.addHandler(handler)              # theirs propagate here
    for name in ("hivemind_chat_agent", "asyncio"):
        logger = logging.getLogger(name)
        kept.append((logger, logger.level))
        logger.setLevel(logging.DEBUG)
    yield records
    root.removeHandler(handler)
    for logger, level in kept:
        logger.setLevel(level)


def settled(gate, within=10.0):
    """Whether every connection and turn place of `gate` is given back within `within` s (the
    server releases a connection just after the client has read its answer); an upper bound
    that only a failing test reaches."""
    return wait_until(lambda: not gate.open_by_peer and not gate.turns_by_peer, within)


def dead_hub_agent(make_agent):
    """An agent whose hub is down: enough for what needs no turn (Describe, deadlines)."""
    return make_agent({"host": "127.0.0.1", "port": free_port(), "key": "k", "password": "p",
                       "connect_timeout": 1, "timeout": 2})


def connect_from(source, port, timeout=5.0):
    """A TCP connection to the server from `source` (a loopback address of the test's)."""
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def seconds_until_closed(s, within):
    """How long until the server closed `s` (end of stream or a reset), reading what it
    sends; None if it is still open after `within` seconds."""
    start = time.monotonic()
    while True:
        left = within - (time.monotonic() - start)
        if left <= 0:
            return None
        s.settimeout(left)
        try:
            if not s.recv(65536):
                return time.monotonic() - start
        except socket.timeout:
            return None
        except ConnectionError:
            return time.monotonic() - start


async def ask(port, text, source="127.0.0.1", conversation_id="c1", within=10.0):
    """One Assist turn as Home Assistant sends it (the wyoming library's writer and reader),
    from `source`; the Handled or NotHandled, or None if the server closed without one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        await async_write_event(Transcript(text, context={"conversation_id": conversation_id},
                                           language="en-US").event(), writer)
        while True:
            event = await asyncio.wait_for(async_read_event(reader), within)
            if event is None:
                return None
            for kind in (Handled, NotHandled):
                if kind.is_type(event.type):
                    return kind.from_event(event)
    except ConnectionError:          # closed at accept: a reset, as often as an end
        return None
    finally:
        writer.close()


async def describe_from(port, source):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        await async_write_event(Describe().event(), writer)
        event = await asyncio.wait_for(async_read_event(reader), 5)
        return Info.from_event(event) if event is not None and Info.is_type(event.type) else None
    finally:
        writer.close()


# ---- who may connect ----
@pytest.mark.parametrize("uri", [None, "tcp://0.0.0.0:{port}", "tcp://[::]:{port}"])
def test_listening_beyond_loopback_without_an_allow_list_refuses_to_start(uri):
    """The real command: exit 2 before it dials the hub or listens, saying why and how."""
    port = free_port()
    argv = [CLI, "wyoming", "--host", "127.0.0.1", "--port", str(free_port()), "--key", "k",
            "--password", "p", "--no-store"]
    if uri:
        argv += ["--uri", uri.format(port=port)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "no authentication" in output and "--allow-from 192.168.1.20" in output, output
    assert "Traceback" not in output
    with socket.socket() as probe:                # it never listened
        probe.bind(("127.0.0.1", port))


def test_a_bad_allow_from_is_refused_at_start_naming_it():
    proc = subprocess.run([CLI, "wyoming", "--allow-from", "192.168.1.300", "--key", "k",
                           "--password", "p", "--no-store"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "'192.168.1.300'" in proc.stdout + proc.stderr


@pytest.mark.hub
def test_a_peer_not_allowed_is_closed_at_accept_and_an_allowed_one_answered(
        creds, make_agent, servers, logged):
    server = servers(make_agent(creds.agent_config(timeout=5)), allow=["127.0.0.2"])
    # closed before it sends anything: nothing of it is read
    s = connect_from("127.0.0.3", server.port)
    assert seconds_until_closed(s, 10) is not None
    s.close()
    # and a transcript from it is never answered
    assert asyncio.run(ask(server.port, "hello", source="127.0.0.3")) is None
    assert asyncio.run(ask(server.port, "hello", source="127.0.0.1")) is None   # not listed
    answer = asyncio.run(ask(server.port, "hello", source="127.0.0.2"))
    assert isinstance(answer, Handled) and answer.text == "hello there"
    # a flood of refused peers is one log line, not one per connection
    for _ in range(200):
        connect_from("127.0.0.3", server.port).close()
    # every one of them refused (counted, then logged or left out, in one step), then a UNIT
    # for a second log line that must not come
    assert wait_until(lambda: server.guard.gate.refused["not allowed"] >= 202, 10)
    hold_still()
    refusals = [r for r in logged if "at accept" in r.getMessage()]
    assert len(refusals) == 1 and "127.0.0.3" in refusals[0].getMessage()
    assert "--allow-from 127.0.0.2/32" in refusals[0].getMessage()
    assert server.guard.gate.refused["not allowed"] >= 202 and server.guard.gate.open == 0


def test_ipv6_peers_are_checked_against_ipv6_networks(make_agent, servers):
    agent = dead_hub_agent(make_agent)
    elsewhere = servers(agent, allow=["fd00::/8", "127.0.0.1"], host="::1")
    s = socket.create_connection(("::1", elsewhere.port), timeout=5)
    assert seconds_until_closed(s, 10) is not None
    s.close()
    listed = servers(agent, allow=["::1/128"], host="::1")

    async def describe_v6():
        reader, writer = await asyncio.open_connection("::1", listed.port)
        await async_write_event(Describe().event(), writer)
        event = await asyncio.wait_for(async_read_event(reader), 5)
        writer.close()
        return event
    assert Info.is_type(asyncio.run(describe_v6()).type)


@pytest.mark.hub
def test_the_command_line_takes_the_allow_list_and_the_deadlines(creds):
    port = free_port()
    proc = subprocess.Popen([CLI, "wyoming", "--uri", f"tcp://127.0.0.1:{port}",
                             "--allow-from", "127.0.0.2", "--allow-from", "127.0.0.4/31",
                             "--idle-timeout", "1", "--host", "127.0.0.1",
                             "--port", str(creds.port), "--key", creds.key,
                             "--password", creds.password, "--no-store"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_serving(port, proc, source="127.0.0.2")          # an allowed peer: no refusal
        assert asyncio.run(ask(port, "hello", source="127.0.0.3")) is None
        for source in ("127.0.0.2", "127.0.0.5"):
            assert asyncio.run(ask(port, "hello", source=source)).text == "hello there"
        idle = connect_from("127.0.0.2", port)                 # --idle-timeout 1
        assert 1 - UNIT < (seconds_until_closed(idle, 5) or 99) < 1 + 4 * UNIT
        idle.close()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    assert "127.0.0.2/32, 127.0.0.4/31" in output and creds.password not in output


# ---- how much one peer may hold ----
@pytest.mark.hub
def test_connection_caps_hold_and_idle_connections_do_not_starve_a_real_request(
        creds, make_agent, servers):
    server = servers(make_agent(creds.agent_config(timeout=5)), allow=["127.0.0.0/8"],
                     caps=Caps(connections=12, connections_per_peer=4))
    port, gate = server.port, server.guard.gate
    hogs = [connect_from("127.0.0.2", port) for _ in range(4)]
    over = connect_from("127.0.0.2", port)                  # the 5th from one peer
    assert seconds_until_closed(over, 10) is not None
    assert all(seconds_until_closed(s, 0.05) is None for s in hogs)   # those 4 stay
    # a flood from many addresses: 12 held in total, the rest closed at once
    flood = [connect_from(f"127.0.1.{i}", port) for i in range(1, 201)]
    closed = sum(seconds_until_closed(s, 0.5) is not None for s in flood)
    assert closed >= 200 - 8 and gate.open <= 12
    # another peer's request once the flood is gone (its places given back): answered while
    # the 4 hogs stay idle and held, long before their idle deadline (30 s) could free one
    for s in flood:
        s.close()
    assert wait_until(lambda: gate.open == len(hogs), 10), gate.open
    answer = asyncio.run(ask(port, "hello", source="127.0.0.9", within=10))
    assert isinstance(answer, Handled) and answer.text == "hello there", answer
    assert gate.open_by_peer["127.0.0.2"] == len(hogs)
    assert all(seconds_until_closed(s, 0.01) is None for s in hogs)
    for s in hogs + [over]:
        s.close()


def wait_serving(port, proc, source="127.0.0.1", within=30.0):
    """Until the command `proc` accepts connections from `source` on `port`; RuntimeError if
    it exits first or does not listen within `within` s."""
    def state():
        if proc.poll() is not None:
            return "exited"
        try:
            connect_from(source, port, 0.2).close()
        except OSError:
            return None
        return "up"
    if wait_until(state, within, poll=0.1) != "up":
        raise RuntimeError(f"hivemind-chat wyoming did not listen (exit {proc.poll()})")


def limit_descriptors(count):
    """For a child process: at most `count` open files, as a small box's 1,024 are."""
    def apply():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))
    return apply


@pytest.mark.hub
def test_one_peers_idle_connections_never_starve_anothers_request(creds, tmp_path):
    """The real command with the default caps (32 per peer, 64 in all), in a process allowed
    512 open files: 700 idle connections from one peer, and another peer's request is
    answered at once; the log stays a few lines. (Before, with 256 files: 348 connections held,
    the request unanswered for over a minute, 2.5 million log lines of "Too many open
    files".) Admitted or not, each connection costs a descriptor for a moment: asyncio
    accepts up to 100 at a time before the first is closed."""
    port = free_port()
    log_path = tmp_path / "wyoming.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([CLI, "wyoming", "--uri", f"tcp://127.0.0.1:{port}",
                                 "--allow-from", "127.0.0.0/8", "--host", "127.0.0.1",
                                 "--port", str(creds.port), "--key", creds.key,
                                 "--password", creds.password, "--no-store"],
                                stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=limit_descriptors(512))
    idle = []
    try:
        wait_serving(port, proc)
        failed = 0
        for _ in range(700):
            try:
                idle.append(connect_from("127.0.0.2", port, 0.2))
            except OSError:               # a server out of descriptors stops accepting
                failed += 1
                if failed > 5:
                    break
        # answered (within=5 s bounds each read) while the peer's 32 places stay held: the
        # request never waited for one of them to reach its idle deadline (30 s)
        answer = asyncio.run(ask(port, "hello", source="127.0.0.3", within=5))
        assert isinstance(answer, Handled) and answer.text == "hello there", answer
        held = sum(seconds_until_closed(s, 0.01) is None for s in idle)
        assert 0 < held <= 32, held               # the rest were closed at accept
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(10)
    lines = log_path.read_text().splitlines()
    assert len(lines) < 30 and not any("Too many open files" in line for line in lines), \
        lines[-5:]


# ---- deadlines ----
def trickled_until_closed(s, data, every, within):
    """Seconds until the server closed `s` while it is sent `data` a byte at a time, one every
    `every` s (each pause ends as soon as the server closes); None if it is still open after
    `within` s or all of it went in."""
    start = time.monotonic()
    for byte in data:
        if time.monotonic() - start > within:
            return None
        try:
            s.sendall(bytes([byte]))
        except OSError:
            return time.monotonic() - start
        if seconds_until_closed(s, every) is not None:
            return time.monotonic() - start
    return None


def test_idle_and_slow_connections_are_closed_within_their_deadlines(make_agent, servers):
    idle_deadline, read_deadline = 1.5, 0.5
    server = servers(dead_hub_agent(make_agent),
                     deadlines=Deadlines(idle=idle_deadline, read=read_deadline))
    port = server.port

    def at_deadline(took, deadline):       # not before it, and not long after
        return took is not None and deadline - UNIT < took < deadline + 3 * UNIT
    idle = connect_from("127.0.0.1", port)
    took = seconds_until_closed(idle, 5)                    # nothing sent
    assert at_deadline(took, idle_deadline), took
    slow = connect_from("127.0.0.1", port)
    slow.sendall(b'{"type": "trans')                        # a header begun, never ended
    took = seconds_until_closed(slow, 5)
    assert at_deadline(took, read_deadline), took
    trickle = connect_from("127.0.0.1", port)               # a byte every 0.1 s: 50 s of it
    took = trickled_until_closed(
        trickle, b'{"type": "transcript", "data": {"text": "hello"}}' * 10, 0.1,
        within=read_deadline + 3 * UNIT)
    assert took is not None, "a trickling header outlived its read deadline"
    block = connect_from("127.0.0.1", port)                 # a data block that never comes
    block.sendall(b'{"type": "transcript", "data_length": 100}\n{"text"')
    took = seconds_until_closed(block, 5)
    assert at_deadline(took, read_deadline), took
    # a complete event resets nothing but answers; the server is still serving
    assert asyncio.run(describe_from(port, "127.0.0.1")).handle
    for s in (idle, slow, trickle, block):
        s.close()
    assert settled(server.guard.gate)          # every place given back


# ---- hostile input ----
def test_nested_malformed_and_truncated_input_is_one_log_line_never_a_traceback(
        make_agent, servers, logged):
    server = servers(dead_hub_agent(make_agent))
    nested_block = b"[" * 60000
    inputs = [
        b"[" * 60000 + b"\n",                                          # header: RecursionError
        b'{"type": "transcript", "data": ' + b'{"a": ' * 20000 + b"\n",
        json.dumps({"type": "transcript", "data_length": len(nested_block)}).encode() +
        b"\n" + nested_block,                                          # data block nests
        b'{"type": "describe"}',                                       # cut short: no newline
        b'{"type": "transcript", "data_length": 50}\n{"text": ',       # data block cut short
        b"\xff\xfe not json\n",
    ]
    for raw in inputs:
        s = connect_from("127.0.0.1", server.port)
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        assert seconds_until_closed(s, 3) is not None
        s.close()
    # every handler ended (its place given back, its line logged), then a UNIT for an
    # exception that escaped one to reach asyncio's log
    assert settled(server.guard.gate)
    hold_still()
    assert not [r for r in logged if r.exc_info or "Traceback" in r.getMessage()]
    lines = [r.getMessage() for r in logged if "closed a connection" in r.getMessage()]
    assert lines and all("\n" not in line and len(line) < 200 for line in lines), lines
    assert "nests too deep" in lines[0]
    # what a web page can send (HTTP, a CORS-simple POST): closed, nothing answered
    page = connect_from("127.0.0.1", server.port)
    page.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1:10700\r\nContent-Type: text/plain\r\n"
                 b"Origin: https://attacker.example\r\n\r\n" + json.dumps(
                     {"type": "transcript", "data": {"text": "unlock the door"}}).encode() +
                 b"\n")
    page.settimeout(3)
    try:
        assert page.recv(65536) == b""
    except ConnectionResetError:         # closed with what it sent still unread: a reset
        pass
    page.close()
    assert asyncio.run(describe_from(server.port, "127.0.0.1")).handle     # still serving


# ---- hang-ups and turns in flight ----
HUB_TIMEOUT = 30     # seconds the talk hub lets an engine answer


@pytest.fixture(scope="module")
def talk_hub(generation):
    """Our plugin with tests/engines.py: "talk N SECONDS" talks for long and stops when told
    (the plugin's defaults: 4 engine calls and 16 waiting turns per client)."""
    hub = HubProcess(plugin_config(timeout=HUB_TIMEOUT), generation=generation).start()
    yield hub
    hub.cleanup()


def engine_stops(agent):
    return [kind for kind, _ in json.loads(agent.get_response("stops", session_id="probe"))]


def test_forty_callers_that_hang_up_mid_turn_do_not_keep_the_hub_busy(talk_hub, make_agent,
                                                                      servers):
    # on 4.0 (a connection and a handshake per session) the connects the abandoned turns had
    # begun are dropped or aborted (client/abandonment.py): finished, they held the next
    # caller 2-4 s. Counted, not timed: with them aborted the next caller still waits about
    # 1.3 s on a quiet machine (the hub ends the handshakes begun), too near to tell apart
    # by the clock on a loaded one; the pool holding a connection per abandoned conversation
    # (23 against 2 or 3) is the same on any machine
    served = make_agent(talk_hub.add_client().agent_config(timeout=30))
    probe = make_agent(talk_hub.add_client().agent_config(timeout=10))
    stops_before = engine_stops(probe).count("stop_session")
    server = servers(served, turn_wait=30)
    assert turn(server.port, "hello").text == "hello there"      # warm: the hub heard

    async def hang_up(k):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            await async_write_event(Transcript("talk 100 0.5", context={
                "conversation_id": f"gone-{k}"}, language="en-US").event(), writer)
            await asyncio.sleep(0.2)
        except ConnectionError:      # past the 32 connections one peer may hold
            pass
        writer.close()

    async def forty():
        await asyncio.gather(*(hang_up(k) for k in range(40)))
    asyncio.run(forty())
    # every place here given back (in about 25 ms: until then the 33rd connection of this
    # peer would still be over its cap), then the next caller, answered
    assert settled(server.guard.gate)
    started = time.monotonic()
    answer = turn(server.port, "hello", conversation_id="the-next-caller")
    assert isinstance(answer, Handled) and answer.text == "hello there", answer
    # before the hub's timeout could have freed its engine calls from abandoned turns
    assert time.monotonic() - started < HUB_TIMEOUT / 3
    # the abandoned conversations did not get a connection each (about 20, the turns
    # admitted): the pool holds the warm one's and the next caller's, and a connect or two
    # that ended just before its caller hung up (4.0), or the few it shares (5.x: up to 4)
    assert len(served.pool) < 10, len(served.pool)
    # no abandoned answer goes on: on 5.x each was sent and the hub told to stop it; on 4.0
    # most were never sent (their connects dropped), and any that was, was stopped
    assert wait_until(lambda: probe.get_response("talking", session_id="probe") == "0",
                      HUB_TIMEOUT / 3, poll=0.1)     # stopped, long before the hub's timeout
    if talk_hub.generation == "5":
        assert engine_stops(probe).count("stop_session") > stops_before


def test_turns_in_flight_are_capped_per_peer_and_others_go_on(talk_hub, make_agent, servers):
    server = servers(make_agent(talk_hub.add_client().agent_config(timeout=30)),
                     allow=["127.0.0.0/8"], caps=Caps(turns_per_peer=1), turn_wait=1.0)

    async def turn_begun(peer):
        """Until `peer` has a turn in flight (the event loop goes on sending it meanwhile)."""
        return await asyncio.to_thread(
            wait_until, lambda: server.guard.gate.turns_by_peer[peer] >= 1, 10)

    async def main():
        long = asyncio.ensure_future(ask(server.port, "talk 5 0.5", "127.0.0.2", "long"))
        assert await turn_begun("127.0.0.2")           # the long turn holds the one place
        start = time.monotonic()
        second = await ask(server.port, "hello", "127.0.0.2", "second")
        waited = time.monotonic() - start
        other = await ask(server.port, "hello", "127.0.0.3", "other")
        return await long, second, waited, other
    long, second, waited, other = asyncio.run(main())
    assert isinstance(long, Handled) and long.text.count("talk sentence") == 5
    assert isinstance(second, NotHandled) and second.text == SPOKEN["busy"]
    assert 1.0 - UNIT < waited < 1.0 + 3 * UNIT, waited     # turn_wait, then busy
    assert isinstance(other, Handled) and other.text == "hello there"     # its own places

    async def queued():                 # a short turn's place comes in time: it waits
        short = asyncio.ensure_future(ask(server.port, "talk 2 0.2", "127.0.0.2", "short"))
        assert await turn_begun("127.0.0.2")
        return await ask(server.port, "hello", "127.0.0.2", "after"), await short
    after, short = asyncio.run(queued())
    assert after.text == "hello there" and short.text.count("talk sentence") == 2
