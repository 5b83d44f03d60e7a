"""`SatelliteBook`: the satellite sessions a hub plugin follows, under one lock, and everything
a session holds that goes when the plugin lets it go.

core/satellites.SatelliteSessions is the bookkeeping without I/O (which connections use which
session, the TTL, the per-client cap). The plugin reaches it from three threads: the IO loop
(an utterance, a closed connection, the sweep timer), its workers (is a turn's session still
followed?) and hivemind-core's QUERY worker (a client's QUERY conversation). This class is the
only holder of those sessions and of their lock; the lock guards the bookkeeping alone and is
never held while a session is forgotten (the store, the engine and the asides have their own).

Forgetting a session releases its engine Session (OVOS's SessionManager), its conversation in
the store as this hub follows it, its speech between turns (hub/asides.py) and, for engines
that keep state per session (a relay's upstream), the engine's `forget_session`.
"""
from threading import Lock
from typing import Any, Iterable

from ovos_bus_client.session import SessionManager
from ovos_utils.log import LOG

from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.satellites import SatelliteSessions
from hivemind_chat_agent.hub.asides import Asides
from hivemind_chat_agent.hub.connections import connection_client, connection_token
from hivemind_chat_agent.hub.conversation_store import ConversationStore
from hivemind_chat_agent.hub.settings import HubSettings


class SatelliteBook:
    """The satellite sessions the plugin follows (by engine session id)."""

    def __init__(self, settings: HubSettings, clock: Clock, store: ConversationStore,
                 asides: Asides, engine: Any):
        self._sessions = SatelliteSessions(settings.session_ttl,
                                           settings.max_sessions_per_client)
        self._lock = Lock()
        self._clock = clock
        self._store = store
        self._asides = asides
        self._engine = engine
        self._sweep_interval = min(settings.session_ttl, 60.0)
        self._sweeping = False

    def touch(self, session_id: str, client: Any, peer: str) -> None:
        """A turn (or QUERY) of `session_id` from the connection `client`, known as `peer`:
        followed from now, for session_ttl; the client's least recently seen sessions beyond
        max_sessions_per_client are let go."""
        with self._lock:
            evicted = self._sessions.touch(session_id, connection_token(client), peer,
                                           self._clock.now(), connection_client(client))
        self._forget(evicted)

    def keep_sweeping(self) -> None:
        """IO loop: start the sweep that lets go sessions unseen for session_ttl, on a timer
        of the clock's (no thread), once. It must start on the IO loop: the plugin's clock
        sets its timers on the loop of the thread that asks."""
        if not self._sweeping:
            self._sweeping = True
            self._clock.call_later(self._sweep_interval, self._sweep)

    def _sweep(self) -> None:
        with self._lock:
            expired = self._sessions.expired(self._clock.now())
        self._forget(expired)
        self._clock.call_later(self._sweep_interval, self._sweep)

    def closed(self, client: Any) -> None:
        """IO loop: the connection `client` is gone; so is every session no other connection
        uses. By the object: its peer string may be stale (a HELLO renames a connection)."""
        with self._lock:
            gone = self._sessions.closed(connection_token(client))
        self._forget(gone)

    def forget_if_untracked(self, session_id: str) -> None:
        """Worker: a turn that outlived its satellite must not leave its session behind."""
        if session_id not in self:
            self._forget([session_id])

    def __contains__(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    @property
    def peers(self) -> int:
        """How many connections' names are kept (one per connection)."""
        with self._lock:
            return self._sessions.peers

    def _forget(self, session_ids: Iterable[str]) -> None:
        """These satellite sessions are gone: their engine Sessions, conversations as this
        hub follows them, speech subscriptions and the engine's own state of them."""
        forget = getattr(self._engine, "forget_session", None)   # a relay's upstream state
        for session_id in session_ids:
            SessionManager.sessions.pop(session_id, None)
            self._store.forget(session_id)
            self._asides.stop(session_id)
            if callable(forget):
                try:
                    forget(session_id)
                except Exception as e:   # an engine's bug must not stop the forgetting
                    LOG.warning(f"engine could not forget a session: {type(e).__name__}")
