"""Background threads that never take the process's signals, and a way off the event loop.

A signal sent to the process (Ctrl-C in `hivemind-chat`) may be delivered to any thread that does
not block it; when it lands on one of ours, the main thread, blocked in readline, never sees
it. Threads inherit the signal mask of the thread that starts them, so starting ours with
SIGINT and SIGTERM blocked keeps those for the main thread, where Python handles them anyway.
"""
import asyncio
import queue
import signal
import threading
import time
from typing import Any, Callable, Optional

_BLOCKED = {signal.SIGINT, signal.SIGTERM}


def start(thread: threading.Thread) -> threading.Thread:
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    except (AttributeError, OSError, ValueError):   # no pthread_sigmask on this platform
        thread.start()
        return thread
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread


_to_start: "queue.SimpleQueue" = queue.SimpleQueue()
_launcher: Optional[threading.Thread] = None
_launcher_guard = threading.Lock()


def start_soon(thread: threading.Thread,
               on_error: Callable[[BaseException], None] = lambda e: None) -> threading.Thread:
    """Start `thread` from a launcher thread, without waiting. `Thread.start()` blocks until
    the new thread has run, which with many busy threads takes milliseconds: an event loop
    must never wait for that (64 turns begun at once stalled one for 127 ms)."""
    global _launcher
    with _launcher_guard:
        if _launcher is None or not _launcher.is_alive():
            _launcher = start(threading.Thread(target=_launch, daemon=True,
                                               name="hivemind-chat-launcher"))
    _to_start.put((thread, on_error))
    return thread


def _launch() -> None:
    while True:
        thread, on_error = _to_start.get()
        try:
            start(thread)
        except RuntimeError as e:    # out of threads: tell whoever waits for its result
            on_error(e)


def block_signals() -> None:
    """Block SIGINT/SIGTERM in the calling thread (threads it starts inherit that)."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    except (AttributeError, OSError, ValueError):
        pass


def signal_mask() -> Optional[set]:
    """The calling thread's blocked signals, or None where masks do not exist."""
    try:
        return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    except (AttributeError, OSError, ValueError):
        return None


def restore_signal_mask(mask: Optional[set]) -> None:
    """Set the calling thread's blocked signals back to `mask` (from `signal_mask`)."""
    if mask is None:
        return
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except (AttributeError, OSError, ValueError):
        pass


def unblock_signals() -> None:
    """Let the calling thread take them again; one that arrived meanwhile is delivered now."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
    except (AttributeError, OSError, ValueError):
        pass


class ElasticWorkers:
    """Reusable threads: a job goes to an idle one, and a new one starts whenever none is idle,
    so no job ever waits for another (a caller waiting for its busy session must not hold up
    anyone's turn). Idle threads leave after `idle_timeout` s. Starting a thread costs a few
    hundred microseconds, a tenth of a warm turn on loopback; reusing one costs a queue put."""

    def __init__(self, name: str, idle_timeout: float = 30.0):
        self._name = name
        self._idle_timeout = idle_timeout
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0          # waiting workers not yet promised a job

    def submit(self, job: Callable[[], None],
               on_error: Callable[[BaseException], None] = lambda e: None) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1      # that worker is promised this job
        self._jobs.put(job)
        if spawn:
            start_soon(threading.Thread(target=self._work, daemon=True, name=self._name),
                       on_error=on_error)

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_timeout)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:   # nobody was promised to this thread: leave
                        self._idle -= 1
                        return
                continue                 # a job was promised to a waiting worker: wait on
            try:
                job()
            except BaseException:   # jobs report their own errors; the worker goes on
                pass
            with self._lock:
                self._idle += 1


_async_workers = ElasticWorkers("hivemind-chat-async")


async def off_loop(work: Callable[[Callable[[Any, Optional[BaseException]], None]], None],
                   abandon: Optional[Callable[[Any], None]] = None) -> Any:
    """Run `work(settle)` on a worker thread and await what it passes to `settle(result,
    error)`, or what it raises before it settles; the work may go on afterwards (a turn's
    driver does). ElasticWorkers, not a
    bounded executor: one caller waiting for a busy session must never hold up another's
    turn. If the awaiting task is cancelled (or its loop closed) before the result comes,
    `abandon(result)` disposes of it, so nothing is left running unowned: also when the
    cancellation comes after the result was set but before the task resumed (asyncio then
    throws CancelledError into the task and the result would be dropped: a turn already sent,
    never stopped, talked on at the hub after its caller hung up)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: Optional[BaseException]) -> None:
        def apply() -> None:
            if future.cancelled():
                if result is not None and abandon is not None:
                    abandon(result)
            elif future.done():      # settled already: what the work raised later is not ours
                return
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        try:
            loop.call_soon_threadsafe(apply)
        except RuntimeError:      # the loop is closed: nobody will ever take the result
            if result is not None and abandon is not None:
                abandon(result)

    def run() -> None:
        try:
            work(settle)
        except BaseException as e:   # a job that raised before settling must not hang its caller
            settle(None, e)

    _async_workers.submit(run, on_error=lambda e: settle(None, e))
    try:
        return await future
    except asyncio.CancelledError:
        if future.done() and not future.cancelled() and future.exception() is None:
            result = future.result()
            if result is not None and abandon is not None:
                abandon(result)
        raise


class SystemClock:
    """core.clock.Clock on the real clock: monotonic time, real sleeps, and `call_later` on a
    daemon timer thread started from the launcher (never waiting in Thread.start())."""

    now = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    @staticmethod
    def call_later(delay: float, action: Callable[[], Any]) -> Callable[[], None]:
        timer = threading.Timer(delay, action)
        timer.daemon = True
        start_soon(timer)
        return timer.cancel

    @staticmethod
    def wait(condition: Any, timeout: float) -> bool:
        return condition.wait(timeout)


SYSTEM_CLOCK = SystemClock()
