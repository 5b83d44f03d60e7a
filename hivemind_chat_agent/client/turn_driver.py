"""Carries one turn from its utterance to its release, on a thread of its own.

`send()` (the caller's thread, the session's lock held) leases a connection and sends the
utterance; `run()` then moves the connection's events into the `ChatTurn`, judges the end
(core/outcomes.py) and gives everything back: the turn's place in the connection's table, the
lease, the session's saved state and lock. It runs whether or not anyone reads the turn, so a
turn nobody reads still ends, at the latest at its timeout, and frees its session.
"""
import threading
import uuid
from contextlib import ExitStack
from typing import Callable, Iterator, Optional, Protocol, Set

from ovos_bus_client.session import Session
from ovos_utils.log import LOG

from hivemind_chat_agent import background

from hivemind_chat_agent.client.chat_turn import ChatTurn
from hivemind_chat_agent.client.carried_turns import TurnHandle
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.client.pool import ConnectionPool
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.outcomes import Outcome, TurnStatus, judge
from hivemind_chat_agent.core.turns import Ended, Event, Sentence
from hivemind_chat_agent.errors import HiveMindChatError


class TurnHost(Protocol):
    """What a turn needs of the agent it runs for (client/agent.HiveMindChatAgent)."""
    pool: ConnectionPool
    sessions: SessionBook
    settings: ClientConfig

    @property
    def closed(self) -> bool:
        """The agent was shut down."""

    def sessions_in_use(self, current: str) -> Set[str]:
        """Sessions whose state must stay in memory."""


class TurnDriver:
    def __init__(self, agent: TurnHost, session_id: str, session_lock):
        self.agent = agent
        self.session_id = session_id
        # held from send() until release; the agent's table of them is weak, so holding
        # the lock object's owner here is what keeps the session locked
        self._session_lock = session_lock
        self.conn: Optional[HubConnection] = None
        self.handle: Optional[TurnHandle] = None
        self._gate = ExitStack()
        self._terminated = False
        self.on_release: Callable[[], None] = lambda: None
        self.turn: Optional[ChatTurn] = None     # set before send(): terminate() may come

    def send(self, session: Session, utterance: str) -> None:
        """Lease a connection and send the utterance; on failure everything is given back
        and the typed error raised."""
        agent = self.agent
        try:
            self.conn = agent.pool.acquire(session)      # leased: eviction leaves it alone
            self._gate.enter_context(agent.pool.gate.turn())
            self.handle = self.conn.start_turn(session, utterance, uuid.uuid4().hex,
                                               agent.settings.timeout)
        except BaseException:
            self.release(None)
            raise

    def run(self) -> None:
        turn = self.turn
        outcome: Optional[Outcome] = None
        try:
            for event in self._events():
                if isinstance(event, Sentence):
                    turn._add_sentence(event.text)
                else:
                    outcome = self._judge(event)
        except Exception as e:   # ours, never the hub's: still end the turn and free it
            LOG.exception("a turn's driver failed")
            error = e if isinstance(e, HiveMindChatError) else HiveMindChatError(
                f"the turn failed on this side ({type(e).__name__}: {e})")
            outcome = Outcome(TurnStatus.LOST, error, in_step=False)
        except BaseException:    # Ctrl-C in continue_chat's caller: the hub stops it too
            self.terminate()
            outcome = Outcome(TurnStatus.CANCELLED, in_step=False)
            raise
        finally:
            outcome = outcome or Outcome(TurnStatus.LOST, HiveMindChatError(
                "the turn ended without an outcome"), in_step=False)
            self.release(outcome)
            turn._end(outcome)

    def adopt(self, thread: Optional[threading.Thread] = None) -> None:
        """Make `thread` (this one by default) the turn's driver: the ChatTurn then knows
        whom terminate() asks, and not to wait for itself."""
        self.turn._attach(self.terminate, thread or threading.current_thread())

    def terminate(self) -> None:
        """Barge-in (any thread): tell the hub to stop this session's answer, then end the
        turn here at once; its late replies carry its tag and reach no later turn."""
        conn, handle = self.conn, self.handle
        if conn is None or handle is None or handle.turn.state.is_final:
            return
        self._terminated = True
        conn.stop_answer(handle, on_stopped=self.turn._hub_stopped)
        conn.abort(handle, "stopped by the caller")

    def release(self, outcome: Optional[Outcome]) -> None:
        agent, conn, handle, sid = self.agent, self.conn, self.handle, self.session_id
        try:
            if conn is not None and handle is not None:
                if not handle.turn.state.is_final:
                    conn.abort(handle, "the turn was given up")
                conn.finish_turn(handle, stopped=self._terminated)
            self._gate.close()
            if conn is not None:
                agent.pool.release(conn)
            agent.sessions.save(sid)
            agent.sessions.trim(keep=agent.sessions_in_use(sid))
            # Late replies of an unfinished turn carry its tag and cannot reach the next one,
            # so the connection is kept (reconnecting is what disturbs a hub), unless it is
            # gone or the hub strips our tags.
            in_step = outcome is not None and outcome.in_step
            if conn is not None and ((outcome is not None and outcome.lost) or
                                     (not in_step and conn.untagged)):
                agent.pool.discard(sid)
        finally:
            self.on_release()
            self._session_lock.lock.release()

    def _events(self) -> Iterator[Event]:
        conn, handle = self.conn, self.handle
        return turn_events(handle, lambda: conn.expire(handle), conn.turns.clock)

    def _judge(self, event: Ended) -> Outcome:
        handle = self.handle
        outcome = judge(event, spoke=bool(handle.turn.sentences), refusal=handle.error,
                        terminated=self._terminated, agent_closed=self.agent.closed,
                        timeout=self.agent.settings.timeout)
        if outcome.status is TurnStatus.TIMED_OUT and outcome.error is None:
            LOG.warning(f"hub stopped mid-answer ({event.reason}); returning what arrived")
        elif outcome.error is None and outcome.status is not TurnStatus.ANSWERED:
            LOG.debug(f"turn ended: {outcome.status.value} {event.reason}")
        return outcome


def turn_events(handle: TurnHandle, expire: Callable[[], None],
                clock: Clock) -> Iterator[Event]:
    """The turn's events as they come, up to and including its end. Each wait lasts until the
    turn's deadline on `clock`; one that runs out calls `expire`, which ends the turn (timeout)
    unless a sentence rolled the deadline forward meanwhile."""
    while True:
        event = handle.next_event(clock, handle.turn.deadline - clock.now())
        if event is None:
            expire()
            continue
        yield event
        if isinstance(event, Ended):
            return


def start_driver(driver: TurnDriver) -> threading.Thread:
    thread = threading.Thread(target=driver.run, daemon=True,
                              name=f"hivemind-chat-turn-{driver.session_id}")
    driver.adopt(thread)
    return background.start(thread)
