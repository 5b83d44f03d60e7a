"""Spare connections for hubs that give each session a connection of its own (4.x).

A new session on such a hub pays the password handshake before its first word: PBKDF2 with
100,000 rounds on both ends, and the hub runs it on its one IO loop, one client at a time (what
that costs: docs/performance.md#why-the-code-is-as-it-is). A spare has done its handshake and
not yet said HELLO, so the hub has not filed it under any session; claiming it costs one HELLO
frame.

Spares are refilled one at a time and only while none of the agent's turns is in flight or
connecting: each handshake holds the hub's loop, and with it every other client's replies. A
refill that finds the agent busy parks; the pool calls `quiet()` when its last turn or connect
ends, and the refill goes on from there (no polling).
"""
import threading
from typing import Any, Callable, List, Optional, Tuple

from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.errors import HiveMindChatError


class Spares:
    def __init__(self, count: int, open_one: Callable[[], Any], busy: Callable[[], bool]):
        """`open_one()`: a connected spare, or a typed error. `busy()`: some turn of the agent
        is in flight or connecting (it takes the pool's lock: the pool never calls in here
        while holding it)."""
        self.count = count
        self._open_one = open_one
        self._busy = busy
        self._cond = threading.Condition()
        self._ready: List[Any] = []
        self._refilling = False   # a refill is running, or parked until the agent is quiet
        self._parked = False
        self._closed = False

    def take(self) -> Optional[Any]:
        """A live spare, or None (dead ones are closed on the way)."""
        dead = []
        with self._cond:
            conn = None
            while self._ready and conn is None:
                candidate = self._ready.pop(0)
                if candidate.alive:
                    conn = candidate
                else:
                    dead.append(candidate)
        for gone in dead:
            gone.close()
        return conn

    def add(self, conn: Any) -> bool:
        """Keep `conn` as a spare; False (and the caller closes it) when none is wanted."""
        with self._cond:
            if not self._closed and len(self._ready) < self.count:
                self._ready.append(conn)
                return True
        return False

    def ready(self) -> List[Any]:
        """The spares waiting now (a copy)."""
        with self._cond:
            return list(self._ready)

    def refill_soon(self) -> None:
        """Start refilling, unless a refill is under way or parked, or none is missing."""
        with self._cond:
            if self._refilling or self._closed or len(self._ready) >= self.count:
                return
            self._refilling = True
        self._start()

    def quiet(self) -> None:
        """The agent has no turn in flight and no connect in progress: a parked refill goes
        on."""
        with self._cond:
            if not self._parked or self._closed:
                return
            self._parked = False
        self._start()

    @property
    def refilling(self) -> bool:
        """A refill is under way: running, or parked until the agent's turns end."""
        with self._cond:
            return self._refilling

    def settle(self, timeout: float) -> int:
        """Wait (at most `timeout`) until no refill is running (none started, it ended, or it
        parked while the agent is busy); the number of spares ready."""
        with self._cond:
            self._cond.wait_for(lambda: not self._refilling or self._parked, timeout)
            return len(self._ready)

    def _start(self) -> None:
        background.start(threading.Thread(target=self._refill, daemon=True,
                                          name="hivemind-chat-spares"))

    def _refill(self) -> None:
        """Until full, or until a spare fails or dies young (the hub is restarting or refusing
        us): then the next new session that finds none starts a refill again, so a hub that
        keeps refusing costs one handshake per new session, never a loop."""
        parked = False
        try:
            while True:
                go, parked = self._next_step()
                if not go:
                    return
                try:
                    conn = self._open_one()
                except HiveMindChatError as e:
                    LOG.info(f"no spare connection opened: {e}")
                    return
                if not self.add(conn):
                    conn.close()
        finally:
            if not parked:          # parked: the refill is still under way, quiet() resumes
                with self._cond:
                    self._refilling = False
                    self._cond.notify_all()

    def _next_step(self) -> Tuple[bool, bool]:
        """(open another spare now, parked): stop when full, closed or a spare died; park
        while the agent is busy."""
        with self._cond:
            dead = [c for c in self._ready if not c.alive]
            self._ready = [c for c in self._ready if c.alive]
            go = not (self._closed or dead or len(self._ready) >= self.count)
            parked = go and self._busy()    # under our lock: a quiet() after this sees it
            if parked:
                self._parked = True
                self._cond.notify_all()
        for gone in dead:
            gone.close()
        return go and not parked, parked

    def __len__(self) -> int:
        with self._cond:
            return len(self._ready)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._parked = self._refilling = False
            conns, self._ready = self._ready, []
            self._cond.notify_all()
        for conn in conns:
            conn.close()
