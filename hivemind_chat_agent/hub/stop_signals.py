"""No SIGTERM lost on its way to hivemind-core's main thread, so a replica told to stop drains.

hivemind-core (4.0.0 and 5.3.10a1 alike) waits for its stop signal in `ovos_utils`'
`wait_for_exit_signal()`: a Python handler sets an Event the main thread waits on. Python runs
that handler only on the main thread, and only once the main thread wakes; a signal the kernel
hands to another thread of the process (any thread that does not block it may get a
process-directed signal) trips the handler's flag there, and the main thread, asleep on its
lock, never wakes to run it. Measured with the OVOS mode on 5.x: 2 SIGTERMs of 12 changed
nothing, the hub kept serving and only a second SIGTERM stopped it; so a service manager's
stop, a rolling restart, went undrained until its kill timeout.

`relay_to_main_thread()` closes that gap without touching hivemind-core's handlers: Python
writes every caught signal's number to the process's wakeup fd (`signal.set_wakeup_fd`),
whichever thread caught it. A daemon thread of ours (SIGTERM and SIGINT blocked in it) reads
that fd and sends each SIGTERM or SIGINT once more, to the main thread itself
(`pthread_kill`), which wakes it: the handler then runs there. A signal that had reached the
main thread runs the handler twice, which sets the same Event twice. The relay's own signal
comes back through the fd once and is not relayed again. Nothing is installed when the wakeup
fd is taken already (an asyncio loop on the main thread owns it then, and wakes that thread
itself), when the plugin is not built on the main thread, or when hivemind-core did not build
it: the relay is installed only with a frame of hivemind-core's own code (`hivemind-core
listen`, `hivemind_core.service`) on the building thread's stack. An embedder such as
`hivemind-chat demo` (bridges/local_hub.py) builds the plugin itself and has its own handlers,
which a relay would run twice: that process imports `hivemind_core.service` too, so whether the
module is loaded says nothing (a demo's Ctrl-C at the prompt ran twice, the second one cutting
its clean exit short with status 130).
"""
import signal
import socket
import sys
import threading
from types import FrameType
from typing import Optional

from hivemind_chat_agent import background

_RELAYED = (signal.SIGTERM, signal.SIGINT)
_HIVEMIND_CORE = "hivemind_core."
_installed: Optional[threading.Thread] = None
_guard = threading.Lock()


def relay_to_main_thread() -> bool:
    """Install the relay once per process (from the main thread); True if it runs."""
    global _installed
    with _guard:
        if _installed is not None:
            return True
        if threading.current_thread() is not threading.main_thread() or \
                not _built_by_hivemind_core(sys._getframe(1)):
            return False
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            reader.close()
            writer.close()
            return False
        if previous != -1:                 # someone else's: give it back, relay nothing
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return False
        thread = threading.Thread(target=_relay, args=(reader, writer,
                                                       threading.main_thread().ident),
                                  daemon=True, name="hivemind-chat-signal-relay")
        _installed = background.start(thread)
        return True


def _built_by_hivemind_core(frame: Optional[FrameType]) -> bool:
    """Whether hivemind-core's code is among `frame` and its callers (it builds the plugin)."""
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_HIVEMIND_CORE):
            return True
        frame = frame.f_back
    return False


def _relay(reader: socket.socket, writer: socket.socket, main: Optional[int]) -> None:
    """Each SIGTERM/SIGINT caught anywhere, sent once more to the main thread. `writer` is
    the process's wakeup fd: held here, it stays open as long as this thread runs."""
    echoes = {sig: 0 for sig in _RELAYED}     # relayed ones whose own byte is still to come
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return
        for number in data:
            sig = next((s for s in _RELAYED if s == number), None)
            if sig is None or main is None:
                continue
            if echoes[sig]:
                echoes[sig] -= 1
                continue
            echoes[sig] += 1
            try:
                signal.pthread_kill(main, sig)
            except (OSError, ProcessLookupError):
                return
