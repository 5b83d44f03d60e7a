"""hub/ovos_bus.OvosBus against a real websocket server on 127.0.0.1 (tornado, as
ovos-messagebus is): it reports up, frames and down, sends, sets its socket options through
the one function, and reconnects when the server comes back on its port."""
import asyncio
import json
import socket
import threading

from waiting import wait_until

from hivemind_chat_agent.hub.ovos_bus import BusNotConnected, OvosBus, socket_options


class EchoBus:
    """A tornado websocket server that sends every frame it gets back to its sender."""

    def __init__(self, port=0):
        self.port = port
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self):
        import tornado.web
        import tornado.websocket

        class Echo(tornado.websocket.WebSocketHandler):
            def on_message(self, message):
                self.write_message(message)

        async def main():
            app = tornado.web.Application([("/core", Echo)])
            self.server = app.listen(self.port, "127.0.0.1")
            self.port = next(iter(self.server._sockets.values())).getsockname()[1]
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            self.server.stop()
            await self.server.close_all_connections()
        asyncio.run(main())

    def stop(self):
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def test_the_bus_connects_sends_receives_and_reconnects():
    server = EchoBus()
    events, frames, sockets = [], [], []

    def configure(ws):
        socket_options(ws)
        sockets.append(ws.sock)     # after: the socket the options replaced it with
    bus = OvosBus(f"ws://127.0.0.1:{server.port}/core", frames.append,
                  lambda: events.append("up"), lambda: events.append("down"),
                  retry=0.05, max_retry=0.2, configure_socket=configure).start()
    try:
        assert bus.connected.wait(10) and events == ["up"]
        assert sockets[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        if hasattr(socket, "TCP_QUICKACK"):    # Linux: every frame acknowledged as it is read
            assert type(sockets[0]).__name__ == "_QuickAckSocket", type(sockets[0])
        bus.send(json.dumps({"type": "ping"}))
        assert wait_until(lambda: frames, 5)
        assert json.loads(frames[0]) == {"type": "ping"}
        port = server.port
        server.stop()
        assert wait_until(lambda: events == ["up", "down"], 10), events
        try:
            bus.send("{}")
            raise AssertionError("sent to a closed bus")
        except BusNotConnected:
            pass
        server = EchoBus(port)
        assert wait_until(lambda: events == ["up", "down", "up"], 10), events
        bus.send(json.dumps({"type": "again"}))
        assert wait_until(lambda: len(frames) == 2, 5)
    finally:
        bus.close()
        server.stop()
