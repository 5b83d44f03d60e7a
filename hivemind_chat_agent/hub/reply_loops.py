"""Where the hub plugin writes replies and runs its timers, on whatever thread a transport hands
it a message.

hivemind-core runs each network protocol on a thread of its own. The websocket transport (4.x
and 5.x) runs an asyncio loop there (tornado's), and on 4.x only that loop may write to a
connection. Others run none: hivemind-mqtt-protocol's thread is paho's, and the ecosystem's test
library (hivescope) delivers in-process on the caller's thread. A plugin that wrote through
tornado's `IOLoop.current()` there answered nothing: that call makes a loop nobody runs.

So each message is given the loop of the thread it arrived on, if one runs there, and the
plugin's own loop otherwise (`loop_here`). The plugin's own loop is an asyncio loop on a daemon
thread it starts on first use: its replies are written there, one at a time in the order they
were handed over, which 5.x connections allow from any thread (their `send` is thread-safe), and
its timers (turn timeouts, the session sweep) run there. Either way a reply handed over on any
thread goes out on one thread, in order, and a timer's action runs where that turn's replies
are written.
"""
import asyncio
import threading
import time
from typing import Any, Callable, List, Optional


class ReplyLoop:
    """An asyncio loop running on the thread `thread_id`: `add_callback` from any thread (FIFO,
    tornado's name for `call_soon_threadsafe`), `call_later` from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread_id: int):
        self.loop = loop
        self.thread_id = thread_id

    def add_callback(self, callback: Callable[..., Any], *args: Any) -> None:
        """Nothing happens once the loop is closed: its plugin or hub has shut down, and a
        worker finishing late has nobody to write to."""
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:      # closed
            pass

    def call_later(self, delay: float, action: Callable[[], Any]) -> Callable[[], None]:
        """Run `action` on the loop's thread in `delay` seconds, set from any thread; the
        returned cancel works from any thread too, also before the timer is armed: once it
        has returned, `action` does not start (a timer already due when a cancel from another
        thread reaches the loop would otherwise run: asyncio moves due timers to its ready
        queue ahead of a callback handed over in the same instant)."""
        armed: List[asyncio.TimerHandle] = []
        cancelled = threading.Event()

        def due() -> None:
            if not cancelled.is_set():
                action()

        def arm() -> None:
            if not cancelled.is_set():
                armed.append(self.loop.call_later(delay, due))

        def cancel_armed() -> None:
            for handle in armed:
                handle.cancel()

        def cancel() -> None:
            cancelled.set()
            self._on_loop(cancel_armed)
        self._on_loop(arm)
        return cancel

    def _on_loop(self, callback: Callable[[], Any]) -> None:
        """Now if this is the loop's thread (asyncio's timers are not thread-safe), else next."""
        if threading.get_ident() == self.thread_id:
            callback()
        else:
            self.add_callback(callback)


class OwnLoop:
    """The plugin's own asyncio loop on a daemon thread, started when first asked for and
    stopped by `close` (the plugin's shutdown)."""

    def __init__(self, name: str = "hivemind-chat-replies"):
        self._name = name
        self._lock = threading.Lock()
        self._running: Optional[ReplyLoop] = None
        self._thread: Optional[threading.Thread] = None

    def get(self) -> ReplyLoop:
        with self._lock:
            if self._running is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()
                ids: List[int] = []

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    ids.append(threading.get_ident())
                    loop.call_soon(started.set)
                    loop.run_forever()
                    loop.close()
                self._thread = threading.Thread(target=run, name=self._name, daemon=True)
                self._thread.start()
                started.wait()
                self._running = ReplyLoop(loop, ids[0])
            return self._running

    def close(self, timeout: float = 2.0) -> None:
        with self._lock:
            running, thread = self._running, self._thread
            self._running = self._thread = None
        if running is not None and thread is not None:
            running.loop.call_soon_threadsafe(running.loop.stop)
            if thread is not threading.current_thread():
                thread.join(timeout)


def loop_here(own: OwnLoop) -> ReplyLoop:
    """The loop running on the calling thread (a transport's IO loop), or the plugin's own."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return own.get()
    return ReplyLoop(loop, threading.get_ident())


class PluginClock:
    """core.clock.Clock for the hub plugin: monotonic time, and timers on the loop of the
    thread that sets them (`loop_here`), so a timeout's action runs where its turn's replies
    are written, whichever transport the turn came in on."""

    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    def __init__(self, own: OwnLoop):
        self.own = own

    def call_later(self, delay: float, action: Callable[[], Any]) -> Callable[[], None]:
        return loop_here(self.own).call_later(delay, action)

    @staticmethod
    def wait(condition: threading.Condition, timeout: float) -> bool:
        return condition.wait(timeout)
