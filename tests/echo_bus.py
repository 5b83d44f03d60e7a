"""A websocket bus on 127.0.0.1 that behaves as ovos-messagebus does for TCP: tornado's server
(Nagle back on after the upgrade) echoing every message to every client, the sender included,
as ovos_messagebus.event_handler does; and the kernel's count of the ACKs a client sent.

Used by tests/test_bus_socket.py (keep_acks_quick) and tests/test_quick_loopback.py (the
loopback route of config/quick-loopback.sh). Run as a script, it prints how many of TURNS
echoes a plain websocket-client connection acknowledged at once on this machine's loopback:

    python tests/echo_bus.py
"""
import asyncio
import contextlib
import socket
import struct
import sys
import threading
from typing import Iterator

import websocket
from waiting import wait_until

TURNS = 40


@contextlib.contextmanager
def tornado_serving(routes) -> Iterator[int]:
    """A tornado Application of `routes` on a free 127.0.0.1 port, its IO loop on a thread of
    its own while `with`-ed; yields the port."""
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop
    from tornado.netutil import bind_sockets
    from tornado.web import Application

    sockets = bind_sockets(0, "127.0.0.1")
    loops = []

    def serve():
        asyncio.set_event_loop(asyncio.new_event_loop())
        HTTPServer(Application(routes)).add_sockets(sockets)
        loops.append(IOLoop.current())
        IOLoop.current().start()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert wait_until(lambda: loops, 10), "the server did not start"
    try:
        yield sockets[0].getsockname()[1]
    finally:
        loops[0].add_callback(loops[0].stop)
        thread.join(10)


@contextlib.contextmanager
def echo_bus() -> Iterator[int]:
    """The bus, serving on a thread of its own while `with`-ed; yields its port."""
    from tornado.websocket import WebSocketHandler

    clients = []

    class Bus(WebSocketHandler):
        def open(self):
            clients.append(self)

        def on_message(self, message):
            for client in clients:
                client.write_message(message)

        def on_close(self):
            clients.remove(self)
    with tornado_serving([("/core", Bus)]) as port:
        yield port


def pure_acks_sent(sock) -> int:
    """Segments this socket sent without data (ACKs), as the kernel counts them."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160)
    segs_out, = struct.unpack_from("I", info, 136)        # tcpi_segs_out
    data_segs_out, = struct.unpack_from("I", info, 156)   # tcpi_data_segs_out
    return segs_out - data_segs_out


def echoes_acked_at_once(ws) -> int:
    """How many of TURNS echoes of our own small messages `ws` acknowledged before it
    returned them, sending each right after the previous echo (as a busy bus client does)."""
    at_once = 0
    for k in range(TURNS):
        before = pure_acks_sent(ws.sock)
        ws.send(f'{{"type": "recognizer_loop:utterance", "data": {{"k": {k}}}}}')
        assert f'"k": {k}' in ws.recv()
        at_once += pure_acks_sent(ws.sock) > before
    return at_once


def plain_client_acks() -> int:
    """echoes_acked_at_once of a plain websocket-client connection (no socket option set)."""
    with echo_bus() as port:
        ws = websocket.create_connection(f"ws://127.0.0.1:{port}/core", timeout=10)
        try:
            return echoes_acked_at_once(ws)
        finally:
            ws.close()


if __name__ == "__main__":
    print(plain_client_acks())
    sys.exit(0)
