"""Spare connections for hubs that give each session a connection of its own (4.x).

A new session on such a hub pays the password handshake before its first word: PBKDF2 with
100,000 rounds on both ends, and the hub runs it on its one IO loop, one client at a time
(about 0.1 s each on a 2-core test machine, about 1.3 s on a Raspberry Pi; 20 new conversations
at once waited 2.5 s). A spare has done its handshake and not yet said HELLO, so the hub has not
filed it under any session; claiming it costs one HELLO frame.

Spares are refilled one at a time and only while none of the agent's turns is in flight or
connecting: each handshake holds the hub's loop, and with it every other client's replies.
"""
import threading
from typing import Callable, List, Optional

from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.errors import HiveMindChatError

IDLE_CHECK = 0.1   # seconds between looks for a quiet moment to refill in


class Spares:
    def __init__(self, count: int, open_one: Callable[[], object], busy: Callable[[], bool]):
        self.count = count
        self._open_one = open_one     # a connected spare, or a typed error
        self._busy = busy             # some turn of the agent is in flight or connecting
        self._lock = threading.Lock()
        self._ready: List = []
        self._refilling = False
        self._closed = threading.Event()

    def take(self) -> Optional[object]:
        """A live spare, or None (dead ones are closed on the way)."""
        dead = []
        with self._lock:
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

    def add(self, conn) -> bool:
        """Keep `conn` as a spare; False (and the caller closes it) when none is wanted."""
        with self._lock:
            if not self._closed.is_set() and len(self._ready) < self.count:
                self._ready.append(conn)
                return True
        return False

    def refill_soon(self) -> None:
        with self._lock:
            if self._refilling or self._closed.is_set() or len(self._ready) >= self.count:
                return
            self._refilling = True
        background.start(threading.Thread(target=self._refill, daemon=True,
                                          name="hivemind-chat-spares"))

    def _refill(self) -> None:
        """Until full, or until a spare fails or dies young (the hub is restarting or refusing
        us): then the next new session that finds none starts a refill again, so a hub that
        keeps refusing costs one handshake per new session, never a loop."""
        try:
            while not self._closed.is_set():
                with self._lock:
                    dead = [c for c in self._ready if not c.alive]
                    self._ready = [c for c in self._ready if c.alive]
                    full = len(self._ready) >= self.count
                for gone in dead:
                    gone.close()
                if full or dead:
                    return
                if self._busy():
                    self._closed.wait(IDLE_CHECK)
                    continue
                try:
                    conn = self._open_one()
                except HiveMindChatError as e:
                    LOG.info(f"no spare connection opened: {e}")
                    return
                if not self.add(conn):
                    conn.close()
        finally:
            with self._lock:
                self._refilling = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._ready)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            conns, self._ready = self._ready, []
        for conn in conns:
            conn.close()
