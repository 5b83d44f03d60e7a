"""The hub plugin drains its replica as hivemind-core stops: the I/O shell of core/drain.py.

**How a SIGTERM reaches the plugin.** hivemind-core runs the plugin in its own process and owns
the process's signals. `hivemind-core listen` builds the agent protocol on the main thread, in
`HiveMindService.run()`, and only then blocks in `ovos_utils.wait_for_exit_signal()`, which
installs its own SIGTERM and SIGINT handlers (they set an event); so a handler the plugin set
while it was built would be replaced before any signal came. On the signal, 4.0.0 marks itself
stopping and returns from `run()`; 5.x (5.3.10a1) runs its shutdown steps (zeroconf presence,
the upstream link, `hm_protocol.shutdown()`: its PSK and QUERY pools; the connections stay
open) and returns. Neither calls the agent protocol's `shutdown()`. The process then exits:
its transports run on daemon threads, which the interpreter leaves running while it calls its
exit hooks, and stops only after.

So the plugin keeps hivemind-core's handler and chains after it: `drain_at_exit` registers an
interpreter exit hook (`threading._register_atexit`, which runs before the interpreter stops
the thread pools hivemind-core's handshakes use, else `atexit`), and there, with the
websocket loop still serving, the drain runs to its end before the process goes: `/readyz`
says "draining" at once, idle satellites are closed (1001, "the hub is restarting"), turns
that arrive are refused (`EndReason.DRAINING`, see hub/protocol.py), the running ones finish
(up to `drain_timeout`), the rest are closed and the plugin shut down. The hook holds the
plugin weakly and does nothing once it was shut down (an embedder that stops the hub itself
calls `ChatAgentProtocol.drain()` first).
"""
import atexit
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterable, List, Mapping, Optional

from ovos_utils.log import LOG

from hivemind_chat_agent.core.drain import Decision, Drain
from hivemind_chat_agent.hub.connections import connection_closed, connection_token, hang_up
from hivemind_chat_agent.hub.stop_signals import relay_to_main_thread

DRAINING_WHY = ("this hub is shutting down and did not run the turn; send it to another hub "
                "(our client does so by itself)")
DRAINING_SPEECH = "This hub is restarting. Please ask again in a moment."
CLOSE_CODE = 1001            # "going away": the server is shutting down
CLOSE_REASON = "the hub is restarting"
HANG_UP_WAIT = 1.0           # seconds the exit waits for the loops to have closed them
_LOOP = "_hivemind_chat_loop"


@dataclass(frozen=True)
class DrainReport:
    seconds: float       # from the drain's start to its end
    finished: int        # turns that were running at its start, or were queued, and ended
    cut: int             # turns still running at drain_timeout
    refused: int         # turns that arrived meanwhile
    closed: int          # connections closed


def note_loop(client: Any, loop: Any) -> None:
    """IO loop, as a satellite connects: the loop its connection is written and closed on."""
    try:
        setattr(client, _LOOP, loop)
    except AttributeError:     # a slotted object: closed on the fallback loop
        pass


class HubDrain:
    """The plan (core/drain.Drain) under a lock, fed by the plugin's threads: the IO loop
    (connections, refusals), the workers (turns ending) and the exit hook (`run`)."""

    def __init__(self, timeout: float, connections: Callable[[], Iterable[Any]],
                 fallback_loop: Callable[[], Any], clock: Callable[[], float] = time.monotonic,
                 count_turns: Optional[Callable[[], Mapping[Any, int]]] = None):
        """`count_turns`, for a shell that counts its turns itself (the OVOS mode): the
        running turns of each connection token, read under this object's lock (it must not
        wait for a lock held by anyone who calls in here); `admit`/`turn_ended` then go
        unused and the shell calls `recount` when a turn may have ended."""
        self.plan = Drain(timeout)
        self._count_turns = count_turns
        self._connections = connections      # hivemind-core's open connection objects
        self._fallback_loop = fallback_loop
        self._clock = clock
        self._changed = threading.Condition()
        self._by_token: Dict[Hashable, Any] = {}
        self._loops: List[Any] = []          # where closes were queued
        self._tally = threading.Lock()       # `closed` and `_loops`, counted outside _changed
        self._admitted_at_stop = 0
        self.refusals = self.closed = 0

    @property
    def draining(self) -> bool:
        return self.plan.draining

    def admit(self, client: Any) -> bool:
        """IO loop: run this connection's turn (counted until `turn_ended`), or refuse it."""
        with self._changed:
            return self.plan.admit(connection_token(client))

    def refused(self) -> None:
        """IO loop, after a refusal's replies were queued: its connection may be idle now."""
        with self._changed:
            self.refusals += 1
            decision = self.plan.refused(self._clock(), self._open_if_draining())
            self._changed.notify_all()
            names = self._by_token
        self._apply(decision, names)

    def turn_ended(self, client: Any) -> None:
        """Any thread, after the turn's end was queued on its loop (so a close comes after)."""
        with self._changed:
            decision = self.plan.turn_ended(connection_token(client), self._clock(),
                                            self._open_if_draining())
            self._changed.notify_all()
            names = self._by_token
        self._apply(decision, names)

    def connected(self, client: Any, loop: Any) -> None:
        note_loop(client, loop)
        with self._changed:
            self.plan.connected(connection_token(client), self._clock())

    def disconnected(self, client: Any) -> None:
        with self._changed:
            self.plan.disconnected(connection_token(client))
            self._changed.notify_all()

    def run(self, begin: Callable[[], None]) -> DrainReport:
        """The drain from its start (`begin`: not ready from now on) to its end, blocking the
        calling thread (the exit hook's) until no admitted turn runs or `drain_timeout`."""
        started = self._clock()
        begin()
        with self._changed:
            if self._count_turns is not None:
                self.plan.running_now(self._count_turns(), started, ())
            self._admitted_at_stop = self.plan.running
            decision = self.plan.stop(started, self._open())
            names = self._by_token
        self._apply(decision, names)
        while True:      # the end may come from any thread's event (a turn ending, mostly)
            with self._changed:
                if self.plan.over:
                    break
                self._changed.wait(self.plan.next_tick(self._clock()))
                decision = self._decide_now()
                names = self._by_token
            self._apply(decision, names)
        self._wait_hung_up()
        cut = self.plan.cut
        return DrainReport(self._clock() - started, self._admitted_at_stop - cut, cut,
                           self.refusals, self.closed)

    def recount(self) -> None:
        """Any thread, holding no lock the count takes: a counted turn may have ended (the
        OVOS mode's utterance was handled, lost or forgotten); while draining the plan reads
        the count again, and its connections left idle are closed."""
        if self._count_turns is None or not self.plan.draining:
            return
        with self._changed:
            decision = self._decide_now()
            self._changed.notify_all()
            names = self._by_token
        self._apply(decision, names)

    def _decide_now(self) -> Decision:
        """Under the lock: the plan's decision at this moment, from the shell's count of its
        turns when it keeps one."""
        if self._count_turns is None:
            return self.plan.tick(self._clock(), self._open())
        return self.plan.running_now(self._count_turns(), self._clock(), self._open())

    def _open_if_draining(self) -> List[Hashable]:
        """While serving no decision needs the connections: a turn's end costs no copy."""
        return self._open() if self.plan.draining else []

    def _open(self) -> List[Hashable]:
        """Under the lock: the tokens of the connections open now (hivemind-core's table,
        which its IO loop changes meanwhile: copied, and copied again if it changed)."""
        for _ in range(10):
            try:
                clients = list(self._connections())
                break
            except RuntimeError:     # the dict changed size while copied
                continue
        else:
            clients = []
        # a new dict each time: a decision's `names` stay as they were when it was taken
        self._by_token = {connection_token(c): c for c in clients if not connection_closed(c)}
        return list(self._by_token)

    def _apply(self, decision: Decision, names: Dict[Hashable, Any]) -> None:
        """Outside the lock: queue the closes on each connection's loop (`names`: the tokens'
        connections when the decision was taken)."""
        for token in decision.close:
            client = names.get(token)
            if client is None:
                continue
            loop = getattr(client, _LOOP, None) or self._fallback_loop()
            try:
                loop.add_callback(hang_up, client, CLOSE_CODE, CLOSE_REASON)
            except RuntimeError:     # its loop is closed: the transport is gone already
                continue
            with self._tally:
                self.closed += 1
                if loop not in self._loops:
                    self._loops.append(loop)

    def _wait_hung_up(self) -> None:
        """The loops have run the closes queued on them (bounded: a stopped loop runs none)."""
        with self._tally:
            loops = list(self._loops)
        for loop in loops:
            done = threading.Event()
            try:
                loop.add_callback(done.set)
            except RuntimeError:     # closed meanwhile
                continue
            done.wait(HANG_UP_WAIT)


def drain_at_exit(host: Any) -> Callable[[], None]:
    """Register the exit hook that drains `host` (a ChatAgentProtocol, held weakly) before
    the process goes, unless it was shut down already. Returns the hook."""
    relay_to_main_thread()      # else a SIGTERM caught off the main thread is lost
    ref = weakref.ref(host)

    def at_exit() -> None:
        protocol: Optional[Any] = ref()
        if protocol is not None and protocol.serving:
            try:
                protocol.drain()
            except Exception as e:   # the process is going anyway: say why it did not drain
                LOG.error(f"the drain failed: {type(e).__name__}: {e}")
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading exit hooks")
        register(at_exit)
    except RuntimeError:       # none, or the interpreter is shutting down already
        atexit.register(at_exit)
    return at_exit
