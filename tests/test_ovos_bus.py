"""hub/ovos_bus.OvosBus against a real websocket server on 127.0.0.1 (tornado, as
ovos-messagebus is): it reports up, frames and down, sends, sets its socket options through
the one function, and reconnects when the server comes back on its port."""
import asyncio
import json
import logging
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


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_bus_that_keeps_refusing_logs_no_line_per_retry_through_websocket_client():
    """websocket-client logs "... - goodbye" at ERROR for every failed connect: under
    hivemind-core's logging that was a line per retry while ovos-core was down. A listener
    that accepts and hangs up at once counts the attempts."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    attempts = []

    def refuse():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            attempts.append(1)
            conn.close()
    threading.Thread(target=refuse, daemon=True).start()
    recorder = Recorder()
    websocket_logger = logging.getLogger("websocket")
    websocket_logger.addHandler(recorder)
    level = websocket_logger.level
    websocket_logger.setLevel(logging.DEBUG)
    bus = OvosBus(f"ws://127.0.0.1:{listener.getsockname()[1]}/core", print,
                  lambda: None, lambda: None, retry=0.02, max_retry=0.05).start()
    try:
        assert wait_until(lambda: len(attempts) >= 5, 10)
        assert recorder.records == []
        websocket_logger.error("someone else's websocket-client error")   # still logged
        assert [r.getMessage() for r in recorder.records] == [
            "someone else's websocket-client error"]
    finally:
        bus.close()
        listener.close()
        websocket_logger.removeHandler(recorder)
        websocket_logger.setLevel(level)
