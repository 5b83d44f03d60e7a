"""One satellite utterance on its way through the hub's engine, and the turns still open.

`HubTurn.finish` guarantees the satellite exactly one end per utterance (answer, failure,
timeout or its own stop), whoever gets there first: the worker running the engine, the IO
loop's timer, or a satellite's `mycroft.stop`. `OpenTurns` finds a session's turns for that stop.

The satellite is told first, the store second. A turn that ends on a worker (the common case:
the engine's answer ended) hands its end to the IO loop and then waits for the loop to have
written it before the worker writes the exchange to the store (a Redis round trip): the
satellite's answer never waits for the store. The hand-off is queue order, not scheduling
luck: `HubTurn._end` queues the end's replies and then a marker on the IO loop, and the loop
runs callbacks in the order they were added (tornado's `add_callback` is asyncio's
`call_soon(_threadsafe)`, one FIFO queue), so when the marker is set the end has been written.
This replaced a `time.sleep(0)` that only offered the GIL to the loop thread, which nothing
obliged to take it. The wait is bounded (`TOLD_WAIT`): a loop that is stopped runs no marker,
and the record must still be kept. The next turn of the session cannot read the history before
the write: the worker is still in this turn's job, and one session's jobs run in order
(hub/serial_executor.py). A turn that ends on the IO loop itself (a timeout, a stop, a refusal)
writes at once: the loop cannot wait for itself, and its end goes out when that callback returns.

`store_durable` turns the order round for an answer that ends on a worker: the store first
(the exchange and the record acknowledged by a replica), then the end, which says
`store_unavailable` instead of answered when that failed. The sentences went out as they came;
only the end waits. Ends on the IO loop (timeouts, stops) are written after, as above.
"""
import threading
from threading import Lock
from typing import Any, Callable, Dict, List, Optional, Protocol

from ovos_bus_client.message import Message
from ovos_bus_client.session import SessionManager
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
from ovos_utils.log import LOG

from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.health import turn_outcome
from hivemind_chat_agent.core.limits import shown, shown_name
from hivemind_chat_agent.core.protocol_names import HANDLED_TYPE, SPEAK_TYPE, UNMATCHED_TYPE
from hivemind_chat_agent.core.transcript import ANSWERED, STOPPED, Exchange, engine_messages
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub.exchanges import EndedExchange
from hivemind_chat_agent.hub.metrics import NoMetrics
from hivemind_chat_agent.hub.refusal_log import warn_refusal
from hivemind_chat_agent.hub.settings import PLUGIN_NAME, HubSettings

TOLD_WAIT = 1.0   # seconds a worker waits for the IO loop to write a turn's end: the loop
                  # writes a queued reply within milliseconds; not at all only once stopped

_ROLES = {"user": MessageRole.USER, "assistant": MessageRole.ASSISTANT}
# ends that leave nothing in the store: it did not answer, or the turn never ran here (a
# draining replica refused it; another one runs it)
_NOT_KEPT = (EndReason.STORE_UNAVAILABLE.value, EndReason.DRAINING.value)


def agent_messages(history: List[Exchange], utterance: str) -> List[AgentMessage]:
    """The engine's `messages` (turns and QUERYs alike): the answered exchanges of `history`,
    then `utterance`."""
    return [AgentMessage(role=_ROLES[role], content=text)
            for role, text in engine_messages(history, utterance)]


class HubTurnHost(Protocol):
    """What a turn needs of the plugin that runs it (hub/protocol.ChatAgentProtocol)."""
    settings: HubSettings
    clock: Clock
    open_turns: "OpenTurns"
    metrics: NoMetrics     # hub/metrics.py: counts each turn's end once, times its sentences

    def deliver(self, turn: "HubTurn", reply: Message) -> None:
        """Hand `reply` to the IO loop, to be written to the turn's connection."""

    def keep_exchange(self, ended: EndedExchange, strict: bool = False) -> None:
        """A turn ended: keep its exchange (and its record, if it has one); `strict`: a
        store that failed raises ConversationStoreError instead of a WARNING."""


def _not_queued() -> None:
    """The job of a turn that never reached the executor (cancelling it finds nothing)."""


class HubTurn:
    """One satellite utterance on its way through the engine. Thread-safe `finish` guarantees
    exactly one end (answer, failure or timeout), whoever gets there first."""

    def __init__(self, protocol: HubTurnHost, message: Message, client: Any, peer: str,
                 loop, utterance: str, satellite_session: Dict[str, Any], session_id: str):
        self.protocol = protocol
        self.message = message
        self.client = client   # the connection that asked: replies go to it, whatever its name
        self.peer = peer       # its name when it asked (for logs and the reply's destination)
        self.loop = loop
        self.utterance = utterance
        self.satellite_session = satellite_session
        self.session_id = session_id
        self.lang = satellite_session.get("lang") or "en-US"
        self.arrived = protocol.clock.now()   # what the turn's latencies are measured from
        self.deadline = self.arrived + protocol.settings.timeout
        self._lock = Lock()
        self.finished = False
        self.spoke = 0
        self.sentences: List[str] = []   # what the satellite was sent, for the transcript
        self.job: Callable[[], None] = _not_queued   # its place in the executor's queue
        self.timer: Optional[Callable[[], None]] = None   # cancels its rolling timeout
        self._stopping = False
        self.turn_id = ""          # the client's id for this turn (its tag), if it sent one
        self.store_client = ""     # whose bounds it counts against in the conversation store
        self.owns_record = False   # this hub runs it and keeps its record (hub/turn_records)
        self.replayed = False      # answered from the record of an earlier run
        self.earlier: List[Any] = []   # the history it began with (core/transcript.Exchange)
        self.sent_begin: Optional[Any] = None   # the store's begin, written as it was queued
        # the thread that runs `loop`'s callbacks: the transport's (a turn is made there, as
        # core hands it over) or the plugin's own loop thread (hub/reply_loops.py)
        self._loop_thread = getattr(loop, "thread_id", threading.get_ident())
        self._told = threading.Event()   # the IO loop has written the end (see the module)

    def reply(self, msg_type: str, data: Dict[str, Any]) -> Message:
        ctx = dict(self.message.context)
        ctx["source"], ctx["destination"] = ctx.get("destination") or PLUGIN_NAME, self.peer
        ctx["session"] = self.session_for_reply()
        return Message(msg_type, data, ctx)

    def session_for_reply(self) -> Dict[str, Any]:
        """The satellite's Session as the engine left it (a relay engine refreshes it from the
        upstream hub), under the id the satellite knows it by."""
        sess = SessionManager.sessions.get(self.session_id)
        if sess is None:
            return self.satellite_session
        data = sess.serialize()
        data["session_id"] = self.satellite_session.get("session_id")
        if self.satellite_session.get("site_id"):
            data["site_id"] = self.satellite_session["site_id"]
        return data

    def speak(self, sentence: str) -> bool:
        # queued under the lock: a timeout's `handled` can never overtake this sentence
        with self._lock:
            if self.finished:
                return False
            self.spoke += 1
            self.sentences.append(sentence)
            now = self.protocol.clock.now()
            self.deadline = now + self.protocol.settings.timeout
            if self.spoke == 1:
                self.protocol.metrics.first_sentence(now - self.arrived)
            self.protocol.deliver(self, self.reply(SPEAK_TYPE, {
                "utterance": sentence, "expect_response": False, "lang": self.lang,
                "meta": {"skill": PLUGIN_NAME}}))
        return True

    def converse(self, engine: Any, sess: Any, messages: List[Any]) -> None:
        """Worker thread: the engine's sentences to the satellite as they come, then the
        turn's end (unless a stop or the timeout ended it first)."""
        answer = None
        try:
            answer = iter(engine.stream_sentences(
                messages, session_id=self.session_id, lang=sess.lang, units=sess.system_unit))
            for sentence in answer:
                if self.finished:
                    return   # stopped or timed out: the satellite already has its end
                if isinstance(sentence, str) and sentence.strip():
                    if not self.speak(sentence):
                        return
        except Exception as e:   # logged before the satellite hears of it
            LOG.warning(f"engine raised {type(e).__name__}: {shown(str(e), 300, quote=False)}")
            self.finish(failed=True, why=f"engine raised {type(e).__name__}",
                        reason=EndReason.ENGINE_ERROR)
            return
        finally:
            close = getattr(answer, "close", None)
            if callable(close):   # a stopped answer's generator ends now, not when collected
                try:
                    close()
                except Exception as e:
                    LOG.debug(f"engine's answer did not close cleanly: {type(e).__name__}")
        self.finish(failed=self.spoke == 0, why="the engine had no answer",
                    reason=EndReason.NOT_UNDERSTOOD)

    def _unwatch(self) -> None:
        """IO loop: drop the rolling-timeout timer of a finished turn."""
        if self.timer is not None:
            self.timer()        # the clock's cancel
            self.timer = None

    def finish(self, failed: bool, why: str = "",
               reason: EndReason = EndReason.NOT_UNDERSTOOD) -> bool:
        """End the turn once, telling the satellite. A failure carries `reason` (an
        EndReason a hub says) and `why` in its data, so the satellite can tell "busy" or
        "broken" from "nothing understood". With `store_durable`, an answer ending on a
        worker is kept first (`_finish_durable`)."""
        outcome = (reason or EndReason.NOT_UNDERSTOOD).value if failed else (
            STOPPED if self._stopping else ANSWERED)
        if not failed and not self.replayed and self.protocol.settings.store_durable and \
                threading.get_ident() != self._loop_thread:
            return self._finish_durable(outcome)
        if not self._end(lambda: self._tell(failed, outcome, why),
                         turn_outcome(failed, reason, stopped=self._stopping,
                                      replayed=self.replayed)):
            return False
        self._warn_failure(failed, why, reason)
        # a replayed turn is kept already; one the store did not answer is not tried again
        if not self.replayed and outcome not in _NOT_KEPT:
            self._after_told(lambda: self.protocol.keep_exchange(self._ended(outcome)))
        return True

    def _finish_durable(self, outcome: str) -> bool:
        """Durable mode: the end is claimed (no sentence, timeout or stop comes after it),
        the exchange and the record are written and acknowledged by a replica, and only then
        is the satellite told: answered, or, when the store failed or no replica acknowledged,
        `store_unavailable` (what it heard is not known to survive a failover, so the hub does
        not say answered). The worker waits for the store here, never the IO loop."""
        if not self._claim_end():
            return False
        failed, why, reason = False, "", EndReason.NOT_UNDERSTOOD
        try:
            self.protocol.keep_exchange(self._ended(outcome), strict=True)
        except ConversationStoreError as e:
            failed, why, reason = True, str(e), EndReason.STORE_UNAVAILABLE
        told = reason.value if failed else outcome
        self._announce(lambda: self._tell(failed, told, why),
                       turn_outcome(failed, reason, stopped=self._stopping))
        self._warn_failure(failed, why, reason)
        return True

    def _tell(self, failed: bool, outcome: str, why: str) -> None:
        """Queue the end's replies: a failure's reason first, then `handled`."""
        if failed:
            self.protocol.deliver(self, self.reply(UNMATCHED_TYPE, {
                "reason": outcome, "message": why}))
        # turn_records: this hub answers a repeated turn id from its record (our client
        # resends a turn lost with its connection only to hubs that say so)
        self.protocol.deliver(self, self.reply(HANDLED_TYPE, {"turn_records": True}))

    def _warn_failure(self, failed: bool, why: str, reason: EndReason) -> None:
        if failed and why and reason not in (EndReason.NONE, EndReason.NOT_UNDERSTOOD):
            warn_refusal("failure", self.peer,
                         f"answering {shown_name(self.peer)} with a failure: {why}")

    def _ended(self, outcome: str) -> EndedExchange:
        return EndedExchange(self.session_id, self.utterance, list(self.sentences), outcome,
                             self.earlier, self.turn_id if self.owns_record else "",
                             self.store_client)

    def _after_told(self, write: Callable[[], None]) -> None:
        """Run `write` once the satellite has been told the turn's end: on a worker, after the
        IO loop ran the marker `_end` queued behind the end (at most TOLD_WAIT); on the IO
        loop, now (see the module docstring for why both are correct)."""
        if threading.get_ident() != self._loop_thread:
            self._told.wait(TOLD_WAIT)
        write()

    def abandon(self) -> bool:
        """End the turn once without a word: its satellite has gone, nobody can hear it."""
        return self._end(lambda: None, turn_outcome(False, abandoned=True))

    def stop(self) -> bool:
        """The satellite stopped this answer: its end goes out now, and nothing more of it
        (the engine's next sentence finds the turn finished and closes its generator); the
        transcript keeps what was said before the stop."""
        self._stopping = True
        return self.finish(failed=False)

    def _end(self, tell, outcome: str) -> bool:
        """The one way a turn ends, whoever ends it: `_claim_end`, then `_announce`. False if
        it had ended already."""
        if not self._claim_end():
            return False
        self._announce(tell, outcome)
        return True

    def _claim_end(self) -> bool:
        """Under its lock: marked finished, unless it was (False)."""
        with self._lock:
            if self.finished:
                return False
            self.finished = True
            return True

    def _announce(self, tell, outcome: str) -> None:
        """Under its lock, `tell` queued, then the marker that it was written, its timer
        dropped and its entry in OpenTurns removed; then counted, once, as `outcome`
        (hub/metrics.py). A sentence can never come between the claim and `tell`: `speak`
        queues under the same lock and only while the turn is not finished."""
        with self._lock:
            tell()
            self.loop.add_callback(self._told.set)   # runs after the end's writes: FIFO
            self.loop.add_callback(self._unwatch)   # its timer would hold it for `timeout`
            self.protocol.open_turns.remove(self)
        self.protocol.metrics.turn_ended(outcome, self.protocol.clock.now() - self.arrived)


class OpenTurns:
    """Turns queued or running, by engine session: what a satellite's stop applies to."""

    def __init__(self, on_removed: Callable[[HubTurn], None] = lambda turn: None):
        self._lock = Lock()
        self._turns: Dict[str, List[HubTurn]] = {}
        self._on_removed = on_removed     # after each turn that was open is removed

    def add(self, turn: HubTurn) -> None:
        with self._lock:
            self._turns.setdefault(turn.session_id, []).append(turn)

    def remove(self, turn: HubTurn) -> None:
        with self._lock:
            turns = self._turns.get(turn.session_id)
            if not turns or turn not in turns:
                return
            turns.remove(turn)
            if not turns:
                del self._turns[turn.session_id]
        self._on_removed(turn)

    def of(self, session_id: str, client: Any) -> List[HubTurn]:
        """That session's open turns, if that connection asked them (a stop never reaches
        another connection's turns)."""
        with self._lock:
            return [t for t in self._turns.get(session_id, ()) if t.client is client]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._turns.values())
