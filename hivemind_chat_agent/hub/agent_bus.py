"""The bus hivemind-core hands satellites' messages to, with no side effects of its own.

ovos-utils' `FakeBus`, the usual default, also stores the Session of every message emitted on it
in `SessionManager`, under whatever id the satellite declared: entries that never expire, and a
satellite declaring another one's engine session id would overwrite that Session mid-turn. Here
handlers run in registration order on the emitting thread (hivemind-core's IO loop), and that is
all. `SatelliteInbox`, the OVOS mode's (hub/ovos_mode.py), then hands every message to its sink.
"""
import threading
from collections import defaultdict
from typing import Callable, Dict, List

from ovos_utils.log import LOG

from hivemind_chat_agent.core.limits import shown


class AgentBus:
    session_id = "default"   # read by some OVOS helpers that expect a bus to have one

    def __init__(self):
        self._lock = threading.Lock()
        self._handlers: Dict[str, List[Callable]] = defaultdict(list)

    def on(self, msg_type: str, handler: Callable) -> None:
        with self._lock:
            self._handlers[msg_type].append(handler)

    def once(self, msg_type: str, handler: Callable) -> None:
        def run_once(message):
            self.remove(msg_type, run_once)
            handler(message)
        self.on(msg_type, run_once)

    def remove(self, msg_type: str, handler: Callable) -> None:
        with self._lock:
            handlers = self._handlers.get(msg_type, [])
            if handler in handlers:
                handlers.remove(handler)
            if not handlers:
                self._handlers.pop(msg_type, None)

    def remove_all_listeners(self, msg_type: str) -> None:
        with self._lock:
            self._handlers.pop(msg_type, None)

    def emit(self, message) -> None:
        with self._lock:
            handlers = list(self._handlers.get(str(getattr(message, "msg_type", "")), ()))
        for handler in handlers:
            try:
                handler(message)
            except Exception as e:   # one handler's bug must not stop the hub's IO loop
                LOG.error(f"agent bus handler for {message.msg_type} raised "
                          f"{type(e).__name__}: {shown(str(e), 200, quote=False)}")

    def close(self) -> None:
        with self._lock:
            self._handlers.clear()


class SatelliteInbox(AgentBus):
    """The bus hivemind-core hands satellites' messages to in OVOS mode: handlers by type, as
    AgentBus (hivemind-core's own status handlers register there), then every message to
    `sink`, on the emitting thread (the IO loop)."""

    def __init__(self, sink):
        super().__init__()
        self.sink = sink

    def emit(self, message) -> None:
        super().emit(message)
        try:
            self.sink(message)
        except Exception as e:   # one message's bug must not stop the hub's IO loop
            LOG.error(f"OVOS mode: {getattr(message, 'msg_type', '?')} raised "
                      f"{type(e).__name__}: {shown(str(e), 200, quote=False)}")
