"""keep_acks_quick() on real loopback sockets, against a tornado websocket server that behaves
as ovos-messagebus does (Nagle back on after the upgrade, every message echoed to every client).

What is checked is the kernel's own count of the ACKs a client sent without data
(TCP_INFO: segs_out - data_segs_out) right after it read each echo: an echo acknowledged at
once releases the bus's next frame at once; an echo whose ACK waits for the delayed-ACK timer
holds it (issue 31; the timings are benchmarks/bench_ovos_bus.py's). No clock is read.
"""
import socket
import threading

import pytest
import websocket
from echo_bus import TURNS, echo_bus, echoes_acked_at_once, pure_acks_sent
from waiting import hold_still, wait_until

from hivemind_chat_agent.hub import bus_socket
from hivemind_chat_agent.hub.bus_socket import (
    check_route,
    keep_acks_quick,
    lacks_quickack,
    route_to,
    warn_of_delayed_acks,
)

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK")
                                or not hasattr(socket, "TCP_INFO"),
                                reason="TCP_QUICKACK and TCP_INFO are Linux's")


@pytest.fixture
def bus_port():
    """tests/echo_bus.py's bus: Nagle on after the upgrade, every message echoed to every
    client, as ovos-messagebus does."""
    with echo_bus() as port:
        yield port


def test_each_echo_is_acknowledged_as_it_is_read(bus_port):
    url = f"ws://127.0.0.1:{bus_port}/core"
    plain = websocket.create_connection(url, timeout=10)
    try:
        # what the stall is made of: the kernel delays these ACKs (all but the few whose
        # timer fired while this thread was descheduled for 40 ms or more)
        assert echoes_acked_at_once(plain) < TURNS
    finally:
        plain.close()
    quick = websocket.create_connection(url, timeout=10)    # alone on the bus, as plain was
    try:
        assert keep_acks_quick(quick) is True
        assert echoes_acked_at_once(quick) == TURNS
        assert quick.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
        assert quick.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert keep_acks_quick(quick) is True                # again: nothing changes
        assert echoes_acked_at_once(quick) == TURNS
    finally:
        quick.close()
    assert quick.sock is None                                # websocket-client closed it


def test_a_message_bus_client_keeps_its_acks_quick_from_on_open(bus_port):
    """The recipe of keep_acks_quick's docstring, with ovos-bus-client's MessageBusClient:
    applied in on_open, its reads (WebSocketApp's loop) go through the new socket."""
    from ovos_bus_client import MessageBusClient
    from ovos_bus_client.message import Message

    class QuickBus(MessageBusClient):
        def on_open(self, *args):
            applied.append(keep_acks_quick(self.client.sock))
            super().on_open(*args)
    applied, echoes = [], []
    bus = QuickBus(host="127.0.0.1", port=bus_port, route="/core")
    bus.on("bench.tick", lambda message: echoes.append(message.data["k"]))
    bus.run_in_thread()
    try:
        assert bus.connected_event.wait(10), "no connection to the bus"
        assert applied == [True]
        at_once = 0
        for k in range(TURNS):
            before = pure_acks_sent(bus.client.sock.sock)
            bus.emit(Message("bench.tick", {"k": k}))
            assert wait_until(lambda k=k: k in echoes, 10), f"echo {k} never came"
            at_once += pure_acks_sent(bus.client.sock.sock) > before
        assert at_once == TURNS
    finally:
        bus.close()


def test_what_it_cannot_take_is_left_alone():
    class Holder:
        sock = None
    assert keep_acks_quick(Holder()) is False
    left, right = socket.socketpair()        # AF_UNIX: no TCP to acknowledge
    try:
        holder = Holder()
        holder.sock = left
        assert keep_acks_quick(holder) is False
        assert holder.sock is left and left.fileno() >= 0
    finally:
        left.close()
        right.close()


# ---- the warning when this machine's route will delay ovos-core's ACKs ----
# what `ip -o route get` said on this machine (iproute2 6.x), with and without the route's
# quickack (config/quick-loopback.sh), and for an address elsewhere
ROUTE_QUICK = "local 127.0.0.1 dev lo src 127.0.0.1 uid 0 \\    cache <local> quickack 1 "
ROUTE_PLAIN = "local 127.0.0.1 dev lo src 127.0.0.1 uid 0 \\    cache <local> "
ROUTE_AWAY = "10.0.0.1 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \\    cache "


def test_only_a_route_to_this_machine_without_quickack_is_named():
    assert lacks_quickack(ROUTE_PLAIN)
    assert not lacks_quickack(ROUTE_QUICK)
    assert not lacks_quickack(ROUTE_AWAY)      # another machine's ACKs: nothing to say here
    assert not lacks_quickack("")              # `ip` missing or failed: nothing known
    assert lacks_quickack(ROUTE_PLAIN.replace("cache <local> ", "cache <local> quickack 0"))


def test_without_ip_nothing_is_known_and_nothing_raised():
    def missing(*_args, **_kwargs):
        raise FileNotFoundError("ip")
    assert route_to("127.0.0.1", run=missing) == ""


def test_the_warning_names_the_fix(warnings_of_ours):
    assert check_route("127.0.0.1", route=lambda _address: ROUTE_PLAIN)
    assert not check_route("127.0.0.1", route=lambda _address: ROUTE_QUICK)
    assert len(warnings_of_ours) == 1
    assert "ip route replace local 127.0.0.1" in warnings_of_ours[0]
    assert "quickack 1" in warnings_of_ours[0] and "40 ms" in warnings_of_ours[0]


def test_a_route_check_that_breaks_is_not_the_connections_problem():
    def broken(_address):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "not ip's usual output")
    assert check_route("127.0.0.1", route=broken) is False


def test_each_address_is_looked_at_once_off_the_connections_thread():
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b = socket.create_connection(listener.getsockname())
    asked, threads = [], []

    def route(address):
        asked.append(address)
        threads.append(threading.current_thread())
        return ROUTE_QUICK
    try:
        bus_socket._ASKED.discard("127.0.0.1")
        warn_of_delayed_acks(a, route=route)
        warn_of_delayed_acks(b, route=route)       # the same address: not asked again
        assert wait_until(lambda: asked)
        with socket.socket() as unconnected:
            warn_of_delayed_acks(unconnected, route=route)   # no peer: nothing asked
        hold_still()                   # time for a second look, were one started
    finally:
        for sock in (a, b, listener):
            sock.close()
        bus_socket._ASKED.discard("127.0.0.1")
    assert asked == ["127.0.0.1"]
    assert threads[0] is not threading.current_thread()
