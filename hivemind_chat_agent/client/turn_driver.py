"""Carries one turn from its utterance to its release, on a thread of its own.

`send()` (the caller's thread, the session's lock held) leases a connection and sends the
utterance with the `ChatTurn` as the turn's sink: the connection's socket thread adds each
sentence to it directly. `run()` waits for the turn's end (expiring it at its deadline),
judges it (core/outcomes.py), gives everything back (the turn's place in the connection's
table, the lease, the session's saved state and lock) and then ends the `ChatTurn`. It runs
whether or not anyone reads the turn, so a turn nobody reads still ends, at the latest at its
timeout, and frees its session.
"""
import threading
import time
import uuid
from contextlib import ExitStack
from typing import Callable, Optional, Protocol, Set, Tuple

from ovos_bus_client.session import Session
from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.client.abandonment import Abandonment
from hivemind_chat_agent.client.carried_turns import TurnHandle, TurnSink
from hivemind_chat_agent.client.chat_turn import ChatTurn
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.client.observer import DRAINING, LOST, UNSENT, ClientObserver
from hivemind_chat_agent.client.pool import ConnectionPool
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.outcomes import Outcome, TurnStatus, judge
from hivemind_chat_agent.core.turns import Ended, EndReason
from hivemind_chat_agent.errors import ConnectionLostError, HiveMindChatError

DRAINING_RESENDS = 4     # attempts after the first refused by a draining replica
DRAINING_PAUSE = 0.4     # seconds more before each of them (0, 0.4, 0.8, 1.2: 2.4 s in all)


class DriverHost(Protocol):
    """What a turn needs of the agent it runs for (client/agent.HiveMindChatAgent)."""
    pool: ConnectionPool
    sessions: SessionBook
    settings: ClientConfig
    hub_keeps_turns: bool
    observer: ClientObserver

    @property
    def closed(self) -> bool:
        """The agent was shut down."""

    def sessions_in_use(self, current: str) -> Set[str]:
        """Sessions whose state must stay in memory."""


class TurnDriver:
    def __init__(self, agent: DriverHost, session_id: str, session_lock,
                 began: Optional[float] = None):
        self.agent = agent
        self.began = time.monotonic() if began is None else began   # for the observer
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
        # what a retry sends again: the turn id (our tag) names the turn on the hub
        self._resend: Optional[Tuple[Session, str, str]] = None
        self._retried = False
        self._drained = 0            # attempts a draining replica refused
        self._last_end: Optional[Ended] = None

    def send(self, session: Session, utterance: str,
             abandonment: Optional[Abandonment] = None) -> None:
        """Lease a connection and send the utterance, unless the caller gave up meanwhile
        (`abandonment`: TurnAbandoned); on failure everything is given back and the typed
        error raised."""
        agent = self.agent
        try:
            self.conn = agent.pool.acquire(session, abandonment)   # leased: eviction spares it
            self._gate.enter_context(agent.pool.gate.turn())
            if abandonment is not None:
                abandonment.check()
            self._resend = (session, utterance, uuid.uuid4().hex)
            try:
                self.handle = self.conn.start_turn(session, utterance, self._resend[2],
                                                   agent.settings.timeout, self._chat_turn())
            except ConnectionLostError as e:
                self._send_on_a_new_connection(e, abandonment)
        except BaseException:
            self.release(None)
            raise

    def _send_on_a_new_connection(self, lost: ConnectionLostError,
                                  abandonment: Optional[Abandonment]) -> None:
        """The leased connection was found gone as the utterance was written (its replica
        died between turns, before the socket thread read the close): a ConnectionLostError
        from `start_turn` means the frame never left whole, so no hub acted on it, and it goes
        once more, same id, on a new connection (a second loss is the caller's)."""
        assert self.conn is not None
        LOG.info(f"the connection was gone before the turn left ({lost}); sending it on a "
                 "new one")
        self._send_again(self.conn, self._chat_turn(), abandonment)
        self.agent.observer.resent(UNSENT)

    def _send_again(self, old: HubConnection, sink: TurnSink,
                    abandonment: Optional[Abandonment] = None) -> None:
        """The turn's utterance sent once more, same id, on a new connection (`self.conn`,
        `self.handle`), its sentences to `sink`; `old` given up first, as broken. Raises what
        connecting or sending raised (`self.conn` is then the new connection, or None)."""
        agent = self.agent
        assert self._resend is not None
        self._gate.close()    # closing and connecting wait for the turns in flight: this one
        agent.pool.release(old)
        agent.pool.broke(self.session_id, old)     # the next connection is a reconnect
        agent.pool.discard(self.session_id)
        self.conn = self.handle = None
        session, utterance, tag = self._resend
        self.conn = agent.pool.acquire(session, abandonment)
        self._gate.enter_context(agent.pool.gate.turn())
        if abandonment is not None:
            abandonment.check()
        self.handle = self.conn.start_turn(session, utterance, tag, agent.settings.timeout,
                                           sink)

    def run(self) -> None:
        turn = self._chat_turn()
        outcome: Optional[Outcome] = None
        try:
            outcome = self._drive()
            while self._may_retry(outcome) and self._retry():
                outcome = self._drive()
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
            turn.end(outcome)
            self._observe(turn, outcome)

    def _observe(self, turn: ChatTurn, outcome: Outcome) -> None:
        observer = self.agent.observer
        try:
            if turn.first_sentence_mono is not None:
                observer.first_sentence(turn.first_sentence_mono - self.began)
            observer.turn_ended(outcome.status, time.monotonic() - self.began)
        except Exception as e:      # a watcher's fault never breaks a turn
            LOG.warning(f"the turn's observer failed: {type(e).__name__}: {e}")

    def _drive(self) -> Outcome:
        """Wait for the current attempt's end (its sentences reach the ChatTurn on their
        own) and judge it."""
        conn, handle = self._attempt()
        self._last_end = until_end(handle, lambda: conn.expire(handle), conn.turns.clock)
        return self._judge(self._last_end)

    def _may_retry(self, outcome: Optional[Outcome]) -> bool:
        """Once, for a turn whose connection was lost before its end, on a hub that keeps
        turn records (it answers the repeated id from its record, or waits for the replica
        running it, so the turn never runs twice); never on an OVOS hub, whose skills may
        have acted already, unless the hub never read the turn (EndReason.UNSENT: an MQTT
        session the hub had dropped). And up to DRAINING_RESENDS times for a turn a draining
        replica refused (it says the turn never ran, so sending it again runs it once,
        anywhere)."""
        end = self._last_end
        if (outcome is None or end is None or self._terminated or self.agent.closed
                or self._resend is None):
            return False
        if outcome.status is TurnStatus.FAILED and end.kind is EndReason.DRAINING:
            return self._drained < DRAINING_RESENDS
        return (outcome.status is TurnStatus.LOST and outcome.lost
                and end.kind in (EndReason.NONE, EndReason.UNSENT) and not self._retried
                and (self.agent.hub_keeps_turns or end.kind is EndReason.UNSENT))

    def _retry(self) -> bool:
        """Send the turn again, same id, on a new connection; False (the loss stands) when no
        connection can be had."""
        (agent, turn), (old, handle) = (self.agent, self._chat_turn()), self._attempt()
        if self._resend is None:      # _may_retry() made sure it is not
            return False
        drained = self._last_end is not None and self._last_end.kind is EndReason.DRAINING
        if drained:
            # the load balancer may not have noticed the drain yet (it checks every second)
            # and send the new connection to the same replica: later attempts wait a little
            old.turns.clock.sleep(DRAINING_PAUSE * self._drained)
            self._drained += 1
            agent.pool.hub_draining(old)
        else:
            self._retried = True
        old.finish_turn(handle)
        try:
            # the hub replays the answer from its first sentence: the caller has some already
            self._send_again(old, Resumed(turn, len(turn.sentences)))
        except HiveMindChatError as e:
            LOG.warning(f"a lost turn could not be sent again: {e}")
            if self.conn is not None:
                agent.pool.release(self.conn)
                self.conn = None
            return False
        unsent = self._last_end is not None and self._last_end.kind is EndReason.UNSENT
        agent.observer.resent(DRAINING if drained else UNSENT if unsent else LOST)
        LOG.info("the hub is draining and did not run the turn; it was sent again" if drained
                 else "the hub never read the turn; it was sent again on a new session"
                 if unsent
                 else "the connection was lost mid-turn; the turn was sent again by its id")
        return True

    def adopt(self, thread: Optional[threading.Thread] = None) -> None:
        """Make `thread` (this one by default) the turn's driver: the ChatTurn then knows
        whom terminate() asks, and not to wait for itself."""
        self._chat_turn().attach_driver(self.terminate, thread or threading.current_thread())

    def terminate(self) -> None:
        """Barge-in (any thread): tell the hub to stop this session's answer, then end the
        turn here at once; its late replies carry its tag and reach no later turn."""
        conn, handle = self.conn, self.handle
        if conn is None or handle is None or handle.turn.state.is_final:
            return
        self._terminated = True
        conn.stop_answer(handle)
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
                if outcome is not None and outcome.lost:
                    agent.pool.broke(sid, conn)     # the next connection is a reconnect
                agent.pool.discard(sid)
        finally:
            self.on_release()
            self._session_lock.lock.release()

    def _chat_turn(self) -> ChatTurn:
        if self.turn is None:
            raise RuntimeError("TurnDriver.turn is set before the turn is sent")
        return self.turn

    def _attempt(self) -> Tuple[HubConnection, TurnHandle]:
        """The connection and handle of the attempt under way (send() or a retry set them)."""
        if self.conn is None or self.handle is None:
            raise RuntimeError("no attempt of this turn is under way")
        return self.conn, self.handle

    def _judge(self, event: Ended) -> Outcome:
        handle = self._attempt()[1]
        outcome = judge(event, spoke=handle.turn.spoken > 0, refusal=handle.error,
                        terminated=self._terminated, agent_closed=self.agent.closed,
                        timeout=self.agent.settings.timeout)
        if outcome.status is TurnStatus.TIMED_OUT and outcome.error is None:
            LOG.warning(f"hub stopped mid-answer ({event.reason}); returning what arrived")
        elif outcome.error is None and outcome.status is not TurnStatus.ANSWERED:
            LOG.debug(f"turn ended: {outcome.status.value} {event.reason}")
        return outcome


def until_end(handle: TurnHandle, expire: Callable[[], None], clock: Clock) -> Ended:
    """The turn's end, waiting for it until the turn's deadline on `clock`; a wait that runs
    out calls `expire`, which ends the turn (timeout) unless a sentence rolled the deadline
    forward meanwhile, and then waits for the new deadline."""
    while True:
        ended = handle.wait_end(clock, handle.turn.deadline - clock.now())
        if ended is not None:
            return ended
        expire()


class Resumed:
    """A turn's sink for its attempt sent again: the first `skip` sentences of the replayed
    answer are the ones the caller already has (the TurnSink protocol, passing on the rest)."""

    def __init__(self, sink: TurnSink, skip: int):
        self.sink, self.skip = sink, skip

    def add_sentence(self, text: str) -> None:
        if self.skip:
            self.skip -= 1
            return
        self.sink.add_sentence(text)

    def hub_stopped(self, skill_id: str) -> None:
        self.sink.hub_stopped(skill_id)

    def end(self, outcome: Outcome) -> None:
        self.sink.end(outcome)


def start_driver(driver: TurnDriver) -> threading.Thread:
    thread = threading.Thread(target=driver.run, daemon=True,
                              name=f"hivemind-chat-turn-{driver.session_id}")
    driver.adopt(thread)
    return background.start(thread)
