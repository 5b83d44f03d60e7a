"""A caller's way to give up on a turn that is still being sent.

An asyncio caller (a front whose client hung up) may be cancelled while its turn's thread is
still waiting to connect or connecting: on a 4.x hub every new conversation opens a connection
of its own, with a handshake the hub does on its IO loop. Abandoned new conversations used to
finish their handshakes before anyone else was served, and then sent utterances nobody would
hear (docs/performance.md#why-the-code-is-as-it-is). With an `Abandonment`, a connect that has
not started is dropped, one in progress is aborted, and the utterance is never sent; a turn
already sent is stopped as before (ChatTurn.terminate).
"""
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from hivemind_chat_agent.errors import HiveMindChatError


class TurnAbandoned(HiveMindChatError):
    """The caller gave up before the turn was sent; nobody waits for this error."""


class Abandonment:
    """Set once by the caller (`give_up`), read by the thread sending the turn (`check`,
    `connecting`). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._given_up = False
        self._connecting: Optional[Any] = None

    def give_up(self) -> None:
        with self._lock:
            self._given_up = True
            conn, self._connecting = self._connecting, None
        if conn is not None:
            conn.abort_connect(TurnAbandoned("the caller gave up while connecting"))

    def check(self) -> None:
        """Raise TurnAbandoned once the caller gave up."""
        if self._given_up:
            raise TurnAbandoned("the caller gave up before the turn was sent")

    @contextmanager
    def connecting(self, conn) -> Iterator[None]:
        """While `conn` connects, giving up aborts it (HubConnection.abort_connect)."""
        with self._lock:
            self.check()
            self._connecting = conn
        try:
            yield
        finally:
            with self._lock:
                self._connecting = None
