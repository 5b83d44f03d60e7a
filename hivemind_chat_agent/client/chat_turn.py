"""`ChatTurn`: one utterance and its answer, as the caller holds it (modelled on AmritaCore's
ChatObject: docs/turns.md).

The turn runs by itself from the moment `begin()` returns. It is the turn's `TurnSink`
(client/carried_turns.py): the connection's socket thread adds each sentence here as it
arrives, the one place a sentence is kept, and the driver (client/turn_driver.py) ends it once
it has judged the end and released the turn's resources, whether or not anyone reads it. This
object only records what happened and hands it out: to iterators (threads), async iterators
(event loops, woken with `call_soon_threadsafe`, never blocked), or one callback (sync or
coroutine) that gets every sentence once, in order. Nothing here touches a socket;
`terminate()` asks the driver to stop the hub's answer.
"""
import asyncio
import inspect
import threading
import time
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Tuple

from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.core.outcomes import Outcome, TurnStatus
from hivemind_chat_agent.errors import HiveMindChatError

TERMINATE_WAIT = 1.0   # seconds terminate() waits for the turn to be released


class ChatTurn:
    def __init__(self, session_id: str, utterance: str, lang: Optional[str]):
        self.session_id = session_id
        self.utterance = utterance
        self.lang = lang
        self._cond = threading.Condition()
        self._sentences: List[str] = []
        self._status = TurnStatus.WAITING
        self._outcome: Optional[Outcome] = None
        self._expect_response = False
        self.first_sentence_mono: Optional[float] = None   # time.monotonic(), for metrics
        self._times: Dict[str, Optional[float]] = {
            "sent_at": time.time(), "first_sentence_at": None, "ended_at": None,
            "hub_stopped_at": None}   # when a skill or engine said it stopped at terminate()
        self._done = threading.Event()       # ended, released, and every callback delivered
        self._wakers: List[Tuple[Any, asyncio.Event]] = []
        self._callback: Optional[Callable[[str], Any]] = None
        self._delivering: Any = None          # the callback's thread, or its task on a loop
        self._delivery_active = False
        self._iterated = False
        self._terminate: Callable[[], None] = lambda: None   # the driver's stop
        self._driver: Optional[threading.Thread] = None

    # ---- what the caller reads ----
    @property
    def status(self) -> TurnStatus:
        return self._status

    @property
    def expect_response(self) -> bool:
        """The hub asked a question and waits for the user's answer (status `asked`)."""
        return self._expect_response

    @property
    def sentences(self) -> List[str]:
        with self._cond:
            return list(self._sentences)

    def is_running(self) -> bool:
        return not self._done.is_set()

    def is_done(self) -> bool:
        return self._done.is_set()

    def get_exception(self) -> Optional[HiveMindChatError]:
        """The typed error this turn ended with; None while running, or if it ended well."""
        outcome = self._outcome
        return outcome.error if outcome is not None and self._done.is_set() else None

    def get_snapshot(self) -> Dict[str, Any]:
        """A plain dict of where the turn stands (wall-clock times, seconds since the epoch)."""
        with self._cond:
            error = self.get_exception()
            return {"session_id": self.session_id, "utterance": self.utterance,
                    "status": self._status.value, "sentences": list(self._sentences),
                    "lang": self.lang, "expect_response": self._expect_response,
                    "error": f"{type(error).__name__}: {error}" if error else None,
                    **self._times}

    def full_response(self, timeout: Optional[float] = None) -> str:
        """Wait for the end; the sentences joined with "\\n". Raises the turn's error (hub
        silence: `TurnTimeoutError`). If the caller's own `timeout` passes first, raises the
        built-in `TimeoutError`: the turn goes on."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the turn is still running after {timeout:g} s; it goes on: "
                               "wait again, or terminate() it")
        error = self.get_exception()
        if error is not None:
            raise error
        return "\n".join(self._sentences)

    async def afull_response(self) -> str:
        await self._until(lambda: self._done.is_set())
        return self.full_response(0)

    def __iter__(self) -> Iterator[str]:
        """Each sentence as it arrives, from the first; ends with the turn, raising its error
        (every iterator of a turn sees every sentence)."""
        self._start_reading()
        yield from self._follow()
        error = self.get_exception()
        if error is not None:
            raise error

    async def __aiter__(self) -> AsyncIterator[str]:
        self._start_reading()
        async for sentence in self._afollow():
            yield sentence
        error = self.get_exception()
        if error is not None:
            raise error

    # ---- what the caller does ----
    def set_callback_func(self, callback: Callable[[str], Any]) -> "ChatTurn":
        """Every sentence goes to `callback`, once and in order, instead of the iterators; one
        that arrived before the call is delivered first. A coroutine function runs on the event
        loop running where it is set (its own loop otherwise); a plain one on a thread of the
        turn's, never the connection's."""
        with self._cond:
            if self._callback is not None:
                raise RuntimeError("this turn already has a callback")
            if self._iterated:
                raise RuntimeError("this turn is already being iterated; set the callback "
                                   "before reading it")
            self._callback = callback
            self._delivery_active = True
            self._done.clear()   # set once it has had the sentences, if the turn has ended
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if inspect.iscoroutinefunction(callback) and loop is not None:
            self._delivering = loop.create_task(self._deliver_on_loop(callback))
        else:
            thread = threading.Thread(target=self._deliver_on_thread, args=(callback,),
                                      daemon=True, name=f"hivemind-chat-callback-"
                                                        f"{self.session_id}")
            self._delivering = background.start_soon(thread)   # maybe on a loop
        return self

    def terminate(self) -> None:
        """Barge-in: end the turn as `cancelled` and tell the hub to stop this session's answer.
        Harmless on a turn that already ended. Waits (at most 1 s) for the session to be free,
        except on an event loop's thread or inside this turn's own callback."""
        if self._outcome is not None:
            return
        self._terminate()
        if self._on_loop_thread() or threading.current_thread() in (
                self._driver, self._delivering):
            return
        self._done.wait(TERMINATE_WAIT)

    # ---- the driver's side: TurnSink (client/carried_turns.py) and who drives it ----
    def attach_driver(self, terminate: Callable[[], None], driver: threading.Thread) -> None:
        """`terminate` stops the turn on the hub (the driver's), `driver` is the thread
        running it: terminate() never waits for that thread to free the session."""
        self._terminate, self._driver = terminate, driver

    def add_sentence(self, text: str) -> None:
        """The next sentence (the connection's socket thread, holding its turn lock: this only
        appends and wakes the readers). Ignored once the turn has ended."""
        with self._cond:
            if self._outcome is not None:
                return
            self._sentences.append(text)
            self._status = TurnStatus.SPEAKING
            if self._times["first_sentence_at"] is None:
                self._times["first_sentence_at"] = time.time()
                self.first_sentence_mono = time.monotonic()
            self._wake()

    def end(self, outcome: Outcome) -> None:
        """The turn is over and its resources are released (the driver, once)."""
        with self._cond:
            if self._outcome is not None:
                return
            self._outcome = outcome
            self._status = outcome.status
            self._expect_response = outcome.status is TurnStatus.ASKED
            self._times["ended_at"] = time.time()
            if not self._delivery_active:   # else the callback's deliverer sets it
                self._done.set()
            self._wake()

    def hub_stopped(self, skill_id: str) -> None:
        """A skill on the hub said it stopped this answer: the snapshot's `hub_stopped_at`."""
        with self._cond:
            if self._times["hub_stopped_at"] is None:
                self._times["hub_stopped_at"] = time.time()
            self._wake()

    # ---- internals ----
    def _start_reading(self) -> None:
        with self._cond:
            if self._callback is not None:
                raise RuntimeError("this turn's sentences go to its callback")
            self._iterated = True

    def _wake(self) -> None:   # caller holds self._cond
        self._cond.notify_all()
        for loop, event in self._wakers:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:   # that loop is closed: its waiter is gone with it
                pass

    async def _until(self, ready: Callable[[], bool]) -> None:
        """Wait on the running loop, without blocking it, until `ready()` holds."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        waker = (loop, event)
        with self._cond:
            if ready():
                return
            self._wakers.append(waker)
        try:
            while True:
                await event.wait()
                event.clear()
                with self._cond:
                    if ready():
                        return
        finally:
            with self._cond:
                self._wakers.remove(waker)

    def _next(self, index: int) -> Optional[str]:
        """The sentence at `index`, or None once the turn has ended without one (caller holds
        the lock and has waited until either is true)."""
        return self._sentences[index] if index < len(self._sentences) else None

    def _follow(self) -> Iterator[str]:
        """Every sentence from the first, waiting (on this thread) for more until the end."""
        index = 0
        while True:
            with self._cond:
                while index >= len(self._sentences) and self._outcome is None:
                    self._cond.wait()
                sentence = self._next(index)
            if sentence is None:
                return
            index += 1
            yield sentence

    async def _afollow(self) -> AsyncIterator[str]:
        """`_follow` for an event loop: it waits without blocking the loop."""
        index = 0

        def more() -> bool:   # the next sentence, or the end, is there
            return index < len(self._sentences) or self._outcome is not None
        while True:
            await self._until(more)
            with self._cond:
                sentence = self._next(index)
            if sentence is None:
                return
            index += 1
            yield sentence

    def _deliver_on_thread(self, callback: Callable[[str], Any]) -> None:
        loop = asyncio.new_event_loop() if inspect.iscoroutinefunction(callback) else None
        try:
            for sentence in self._follow():
                try:
                    if loop is not None:
                        loop.run_until_complete(callback(sentence))
                    else:
                        callback(sentence)
                except Exception:
                    LOG.exception(f"the callback of a turn of session {self.session_id} "
                                  "failed on a sentence; the next ones are still delivered")
        finally:
            if loop is not None:
                loop.close()
            self._delivered()

    async def _deliver_on_loop(self, callback: Callable[[str], Any]) -> None:
        try:
            async for sentence in self._afollow():
                try:
                    await callback(sentence)
                except Exception:
                    LOG.exception(f"the callback of a turn of session {self.session_id} "
                                  "failed on a sentence; the next ones are still delivered")
        finally:   # also when the loop cancels the task: the turn still ends by itself
            self._delivered()

    def _delivered(self) -> None:
        with self._cond:
            self._delivery_active = False
            if self._outcome is not None:
                self._done.set()
            self._wake()

    @staticmethod
    def _on_loop_thread() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    def __repr__(self) -> str:
        return (f"<ChatTurn session={self.session_id!r} status={self._status.value} "
                f"sentences={len(self._sentences)}>")

