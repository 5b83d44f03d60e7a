"""The hub plugin's clock (core.clock.Clock): monotonic time, and timers on the IO loop of the
thread that sets them, which is where hivemind-core hands the plugin its messages. So a turn's
rolling timeout and the session sweep need no thread of their own, and their actions run where
replies may be written. Tests pass `ChatAgentProtocol(clock=FakeClock())` instead."""
import threading
import time
from typing import Any, Callable


class IOLoopClock:
    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    @staticmethod
    def call_later(delay: float, action: Callable[[], Any]) -> Callable[[], None]:
        """Call on the IO loop's thread; the returned cancel too."""
        from tornado.ioloop import IOLoop
        loop = IOLoop.current()
        timeout = loop.call_later(delay, action)
        return lambda: loop.remove_timeout(timeout)

    @staticmethod
    def wait(condition: threading.Condition, timeout: float) -> bool:
        return condition.wait(timeout)
