"""Connection faults against a genuine hub: each ends quickly with a typed, actionable error."""
import logging
import threading
import time

import pytest
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from hubs import free_port
from leaks import agent_threads, threads_left
from ovos_bus_client.message import Message
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
from waiting import UNIT, hold_still, wait_until

from hivemind_chat_agent import (
    AccessKeyRejectedError,
    AgentClosedError,
    ConnectionLostError,
    HandshakeTimeoutError,
    HiveMindChatAgent,
    HiveMindChatError,
    HubUnreachableError,
    WrongPasswordError,
)


def test_wrong_access_key_fails_fast_and_stops_trying(hub, make_agent):
    before = agent_threads()
    agent = make_agent({"host": "127.0.0.1", "port": hub.port, "key": "not-a-registered-key",
                        "password": "whatever"})
    start = time.monotonic()
    with pytest.raises(AccessKeyRejectedError, match="access key") as err:
        agent.get_response("hello", session_id="badkey")
    assert time.monotonic() - start < 15 * UNIT   # at once, not after connect_timeout (10 s)
    assert isinstance(err.value, HiveMindChatError)
    hold_still()                                  # a reconnect would have begun by now
    assert threads_left(before) == set()          # no reconnect loop left behind


def test_wrong_password_fails_fast_and_says_so(hub, creds, make_agent):
    before = agent_threads()
    agent = make_agent(creds.agent_config(password="definitely-not-it"))
    start = time.monotonic()
    with pytest.raises(WrongPasswordError, match="password is wrong"):
        agent.get_response("hello", session_id="badpass")
    assert time.monotonic() - start < 15 * UNIT   # at once, not after connect_timeout (10 s)
    hold_still()                                  # a reconnect would have begun by now
    assert threads_left(before) == set()


def test_hub_down_fails_within_connect_timeout(make_agent):
    agent = make_agent({"host": "127.0.0.1", "port": free_port(), "key": "k", "password": "p",
                        "connect_timeout": 2})
    start = time.monotonic()
    with pytest.raises(HubUnreachableError, match="hivemind-core is running"):
        agent.get_response("hello", session_id="down")
    assert time.monotonic() - start < 2 + 2 * UNIT           # within its connect_timeout


def test_a_server_that_never_handshakes_is_a_handshake_timeout(make_agent):
    """A websocket server on the hub's port that accepts and then says nothing."""
    from echo_bus import tornado_serving
    from tornado.websocket import WebSocketHandler

    class Silent(WebSocketHandler):
        def on_message(self, message):
            pass
    with tornado_serving([("/", Silent)]) as port:
        agent = make_agent({"host": "127.0.0.1", "port": port, "key": "k", "password": "p",
                            "connect_timeout": 1.5})
        start = time.monotonic()
        with pytest.raises(HandshakeTimeoutError, match="did not finish the handshake"):
            agent.get_response("hello", session_id="silent")
        assert 1.4 <= time.monotonic() - start < 1.5 + 4 * UNIT   # at its connect_timeout


def test_hub_killed_mid_turn_then_restarted_conversation_goes_on(own_hub, make_agent):
    creds = own_hub.add_client()
    agent = make_agent(creds.agent_config(timeout=20))
    assert agent.get_response("remember ada", session_id="phoenix") == "I will remember that"
    stream = agent.stream_sentences([AgentMessage(MessageRole.USER, "slow 10 0.5")],
                                    session_id="phoenix")
    assert next(stream) == "slow sentence 1"
    own_hub.kill()
    killed = time.monotonic()
    with pytest.raises(ConnectionLostError, match="next turn reconnects"):
        for _ in stream:
            pass
    assert time.monotonic() - killed < 7 * UNIT   # at once, not the 20 s turn timeout
    with pytest.raises(HubUnreachableError):
        agent.get_response("recall", session_id="phoenix")
    own_hub.start()                               # same port, same client database
    assert agent.get_response("recall", session_id="phoenix") == "you said ada"


def test_shutdown_during_a_turn_ends_it_and_refuses_more(creds):
    agent = HiveMindChatAgent(creds.agent_config(timeout=20))
    errors = []

    def chat():
        try:
            agent.get_response("slow 5 1", session_id="closing")
        except HiveMindChatError as e:
            errors.append(e)
    t = threading.Thread(target=chat)
    t.start()
    # the turn under way: its connection placed and the hub answering on it (the first of
    # its 5 sentences; the answer takes 4 s more)
    assert wait_until(lambda: (conn := agent.pool.peek("closing")) is not None
                      and conn.hub_spoke, 10)
    agent.shutdown()
    t.join(5)
    assert not t.is_alive() and isinstance(errors[0], AgentClosedError)
    with pytest.raises(AgentClosedError):
        agent.get_response("hello", session_id="closing")


def unconnected(session):
    """A HubConnection (and its transport) for `session`, to a port nobody listens on."""
    from hivemind_chat_agent.client.config import ClientConfig
    from hivemind_chat_agent.client.connection import HubConnection
    from hivemind_chat_agent.client.session_book import SessionBook
    config = ClientConfig.from_dict({"host": "127.0.0.1", "port": free_port(), "key": "k",
                                     "password": "p"})
    return config, HubConnection(config, session, SessionBook(session.session_id))


def test_bus_messages_are_never_sent_before_the_key_exists():
    from ovos_bus_client.session import Session

    from hivemind_chat_agent.client.transport import open_transport
    config, owner = unconnected(Session("plain"))
    transport = open_transport(owner, config, "plain-test")
    with pytest.raises(ConnectionLostError, match="encrypted"):
        transport.emit(HiveMessage(HiveMessageType.BUS, payload=Message("speak")))
    with pytest.raises(ConnectionLostError):
        transport.emit(HiveMessage(HiveMessageType.HELLO, payload={}))
    transport.release()
    owner.close()


def test_a_new_connection_leaves_the_session_registry_alone():
    """Opening a connection writes nothing into SessionManager, where the conversation's own
    Session is (hivemind-bus-client's client constructor, beside ovos-bus-client 1.x, put a
    blank one there under the id it was given)."""
    from ovos_bus_client.session import Session, SessionManager

    from hivemind_chat_agent import compat
    mine = compat.register_session(Session("registry-kept"))
    try:
        _, connection = unconnected(mine)
        connection.close()
        assert SessionManager.sessions["registry-kept"] is mine
    finally:
        SessionManager.sessions.pop("registry-kept", None)


def test_key_and_password_never_appear_in_our_logs(hub, creds, monkeypatch):
    from ovos_utils.log import LOG
    records = []
    call_handlers = logging.Logger.callHandlers

    def spy(logger, record):   # every record any logger of this process emits
        records.append(record.getMessage())
        return call_handlers(logger, record)
    monkeypatch.setattr(logging.Logger, "callHandlers", spy)
    old = LOG.level
    LOG.set_level("DEBUG")
    try:
        agent = HiveMindChatAgent(creds.agent_config())
        agent.get_response("hostile", session_id="secrets")
        agent.get_response("fail", session_id="secrets")
        bad = HiveMindChatAgent(creds.agent_config(password="wrong-" + creds.password))
        with pytest.raises(WrongPasswordError) as err:
            bad.get_response("hello", session_id="secrets-2")
        agent.shutdown()
        bad.shutdown()
    finally:
        LOG.set_level(old)
    text = "\n".join(records) + str(err.value) + repr(agent.settings)
    assert "ignoring reply" in text      # our debug logging was captured
    assert creds.key not in text and creds.password not in text


def test_a_stalled_tcp_connect_is_bounded_by_connect_timeout_and_leaves_no_thread(make_agent):
    """A listener whose accept queue is full: the kernel drops our SYNs, connect() hangs."""
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)

    def connected(sock):
        try:
            sock.getpeername()
        except OSError:
            return False
        return True
    # the accept queue is full (listen(0) queues one) once a filler is connected; the SYNs
    # of the others, and ours, are dropped
    assert wait_until(lambda: any(connected(s) for s in fillers), 10)
    before = agent_threads()
    try:
        agent = make_agent({"host": "127.0.0.1", "port": port, "key": "k", "password": "p",
                            "connect_timeout": 1})
        start = time.monotonic()
        with pytest.raises(HubUnreachableError, match="within 1 s"):
            agent.get_response("hello", session_id="stall")
        assert time.monotonic() - start < 1 + 2 * UNIT          # at its connect_timeout
        agent.shutdown()
        assert threads_left(before) == set()
    finally:
        for s in fillers:
            s.close()
        srv.close()


def test_two_agents_with_the_same_credentials_and_session_do_not_collide(creds, make_agent):
    """hivemind-core files connections by useragent and session: each connection has its own."""
    a, b = make_agent(creds.agent_config()), make_agent(creds.agent_config())
    assert a.get_response("hello", session_id="shared-kitchen") == "hello there"
    assert b.get_response("count 1", session_id="shared-kitchen") == "sentence 1"
    b.shutdown()
    assert a.get_response("hello", session_id="shared-kitchen") == "hello there"


def test_a_forged_plain_text_answer_is_never_read(creds, make_agent):
    """Injected bytes on a ws:// path: a plain-text speak + handled carrying our turn tag and a
    Session in another language. The turn waits for the genuine, encrypted answer."""
    from ovos_bus_client.session import SessionManager
    agent = make_agent(creds.agent_config())
    assert agent.get_response("plainforge", session_id="forge") == "genuine"
    assert SessionManager.sessions["forge"].lang != "xx-XX"
    assert agent.get_response("hello", session_id="forge") == "hello there"


def test_a_frame_failing_authentication_ends_the_turn_as_lost(creds, make_agent):
    agent = make_agent(creds.agent_config())
    start = time.monotonic()
    with pytest.raises(ConnectionLostError, match="tampered"):
        agent.get_response("tamper", session_id="tamper")
    assert time.monotonic() - start < 7 * UNIT          # at once, not after the timeout
    assert agent.get_response("hello", session_id="tamper") == "hello there"   # reconnects


def test_an_oversized_reply_is_a_clear_error_and_is_never_buffered(creds, make_agent):
    from hivemind_chat_agent import ReplyTooLargeError
    agent = make_agent(creds.agent_config(max_frame_bytes=64_000))
    assert len(agent.get_response("huge 20000", session_id="huge")) == 20000
    with pytest.raises(ReplyTooLargeError, match="max_frame_bytes=64000"):
        agent.get_response("huge 90000", session_id="huge")
    assert agent.get_response("hello", session_id="huge") == "hello there"


def open_fds():
    import os
    return len(os.listdir("/proc/self/fd"))


def test_sockets_are_closed_at_once_not_at_garbage_collection(creds):
    import gc
    gc.disable()                           # what is left open must not depend on the GC
    try:
        before = open_fds()
        agent = HiveMindChatAgent(creds.agent_config(max_connections=4))
        for i in range(12):                # 8 evictions on the way
            assert agent.get_response("hello", session_id=f"fd-{i}") == "hello there"
        assert open_fds() - before <= 4 + 4     # the 4 live sockets, a little slack
        agent.shutdown()
        assert open_fds() <= before + 1, (before, open_fds())
    finally:
        gc.enable()


def test_shutdown_ends_a_connect_in_progress_at_once(make_agent):
    """A hub that accepts TCP and then never answers: the connect would take connect_timeout."""
    import select
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    agent = HiveMindChatAgent({"host": "127.0.0.1", "port": port, "key": "k", "password": "p",
                               "connect_timeout": 10})
    outcome = {}

    def turn():
        try:
            agent.get_response("hello", session_id="connecting")
        except Exception as e:
            outcome["error"] = e
        outcome["ended"] = time.monotonic()
    t = threading.Thread(target=turn)
    t.start()
    # the connect under way: its TCP connection waits in the silent hub's accept queue
    assert select.select([srv], [], [], 10)[0], "the agent never connected"
    shut = time.monotonic()
    agent.shutdown()
    t.join(5)
    srv.close()
    assert isinstance(outcome.get("error"), AgentClosedError), outcome
    assert outcome["ended"] - shut < 4 * UNIT      # at once, not after connect_timeout (10 s)


def test_wss_to_a_plain_hub_says_so_fast(hub, creds, make_agent):
    agent = make_agent(creds.agent_config(host="wss://127.0.0.1", connect_timeout=10))
    start = time.monotonic()
    with pytest.raises(HubUnreachableError, match="is the hub serving TLS"):
        agent.get_response("hello", session_id="tls")
    assert time.monotonic() - start < 10 * UNIT    # at once, not after connect_timeout (10 s)
