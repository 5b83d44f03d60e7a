"""Background threads that never take the process's signals.

A signal sent to the process (Ctrl-C in `hivemind-chat`) may be delivered to any thread that does
not block it; when it lands on one of ours, the main thread, blocked in readline, never sees
it. Threads inherit the signal mask of the thread that starts them, so starting ours with
SIGINT and SIGTERM blocked keeps those for the main thread, where Python handles them anyway.
"""
import signal
import threading

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


def block_signals() -> None:
    """Block SIGINT/SIGTERM in the calling thread (threads it starts inherit that)."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    except (AttributeError, OSError, ValueError):
        pass


def unblock_signals() -> None:
    """Let the calling thread take them again; one that arrived meanwhile is delivered now."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED)
    except (AttributeError, OSError, ValueError):
        pass
