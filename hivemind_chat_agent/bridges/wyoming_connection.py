"""One Wyoming connection, from accept to close (`hivemind-chat wyoming`).

Wyoming has no authentication, so what guards the hub behind it is here:

- `Doorman`, the server's protocol factory: at accept, before a byte is read, a peer that is
  not allowed (core/peer_gate.AllowList) or over the connection caps (PeerGate) is closed, in
  one log line per kind a minute at most (Notices), so a flood cannot fill the log;
- `serve_connection`: events bounded in size and time (bridges/wyoming_events.py), Describe ->
  Info, Transcript -> Handled/NotHandled, anything else ignored, until the client closes, goes
  idle, or sends what is not an event (one log line, never a traceback);
- while a turn is in flight the connection is watched: a caller that hangs up ends its turn at
  once (the hub is told to stop, as Ctrl-C does in the CLI), so abandoned requests never keep
  the hub busy for the next caller; a peer has at most `Caps.turns_per_peer` turns in flight,
  and a transcript over that waits for a place (bounded by the agent's timeout).
"""
import asyncio
import collections
import contextlib
import logging
import time
from typing import Any, Callable, Deque, Dict, Optional

from hivemind_chat_agent.bridges.wyoming_bridge import SPOKEN, WyomingBridge
from hivemind_chat_agent.bridges.wyoming_events import (
    MAX_LINE,
    BadEvent,
    Deadlines,
    EventTimeout,
    read_event,
)
from hivemind_chat_agent.core.peer_gate import NOT_ALLOWED, Notices, PeerGate

LOG = logging.getLogger(__name__)
MAX_LANGUAGE = 35       # characters of a language tag taken (longer: the hub's default)


class Guard:
    """The server's side of core/peer_gate: its PeerGate and Notices, the deadlines, and the
    waiting for a turn's place (on the event loop that serves)."""

    def __init__(self, gate: PeerGate, deadlines: Deadlines = Deadlines(),
                 turn_wait: float = 30.0, now: Callable[[], float] = time.monotonic,
                 metrics: Any = None):
        self.gate = gate
        self.metrics = metrics      # bridges/front_metrics.FrontMetrics, or None: off
        self.deadlines = deadlines
        self.turn_wait = turn_wait
        self.notices = Notices(now)
        self._waiting: Dict[str, Deque[asyncio.Future]] = {}   # per peer, oldest first

    def count(self, status: str) -> None:
        """One exchange ended with `status` (front_metrics.WYOMING_STATUSES)."""
        if self.metrics is not None:
            self.metrics.request(status)

    def log(self, kind: str, level: int, text: str) -> None:
        """`text`, unless a line of `kind` was logged less than a minute ago."""
        line = self.notices.line(kind, text)
        if line is not None:
            LOG.log(level, line)

    @contextlib.asynccontextmanager
    async def turn_place(self, peer: str):
        """Yields True once `peer` has a place for one more turn in flight, False if none came
        within `turn_wait`; the place is given back on leaving, however that happens (to the
        peer's longest waiting transcript, if any). Waiting is on a future of its own, never
        under asyncio.wait_for, which can swallow a cancellation (a hang-up) that comes as
        the place does."""
        placed = await self._take_place(peer)
        try:
            yield placed
        finally:
            if placed:
                self._give_back(peer)

    async def _take_place(self, peer: str) -> bool:
        if self.gate.try_begin_turn(peer):   # while some wait, places are handed, not freed
            return True
        loop = asyncio.get_running_loop()
        handed = loop.create_future()
        self._waiting.setdefault(peer, collections.deque()).append(handed)
        def give_up() -> None:
            if not handed.done():
                handed.set_result(False)
        timer = loop.call_later(self.turn_wait, give_up)
        try:
            return await handed
        except asyncio.CancelledError:
            if handed.done() and not handed.cancelled() and handed.result():
                self._give_back(peer)         # handed to a caller that has just hung up
            raise
        finally:
            timer.cancel()
            queue = self._waiting.get(peer)
            if queue is not None:
                if handed in queue:
                    queue.remove(handed)
                if not queue:
                    del self._waiting[peer]

    def _give_back(self, peer: str) -> None:
        """A turn of `peer` has ended: its place goes to the peer's next waiter (the count
        stays), else back to the gate."""
        for handed in self._waiting.get(peer, ()):
            if not handed.done():
                handed.set_result(True)
                return
        self.gate.end_turn(peer)


class Doorman(asyncio.Protocol):
    """The protocol every accepted connection starts with. It decides at once: a connection
    the gate refuses is closed before anything of it is read; one it admits is handed to a
    StreamReaderProtocol running `serve_connection`, and counted until that ends."""

    def __init__(self, bridge: WyomingBridge, guard: Guard, tasks: set):
        self.bridge, self.guard, self.tasks = bridge, guard, tasks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)   # a stream server's connection
        peer = _host(transport.get_extra_info("peername"))
        refused = self.guard.gate.admit(peer)
        if refused is not None:
            transport.abort()
            self.guard.count("refused")
            self.guard.log(refused, logging.WARNING if refused == NOT_ALLOWED else logging.INFO,
                           f"Wyoming: closed a connection from {peer} at accept: {refused}"
                           + (f" (--allow-from {self.guard.gate.allow.describe()})"
                              if refused == NOT_ALLOWED and self.guard.gate.allow else ""))
            return
        reader = asyncio.StreamReader(limit=MAX_LINE)

        async def serve(reader, writer):
            self.tasks.add(asyncio.current_task())
            try:
                await serve_connection(self.bridge, reader, writer, self.guard, peer)
            finally:
                self.guard.gate.release(peer)
                self.tasks.discard(asyncio.current_task())
        protocol = asyncio.StreamReaderProtocol(reader, serve)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)


async def serve_connection(bridge: WyomingBridge, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter, guard: Optional[Guard] = None,
                           peer: Optional[str] = None) -> None:
    """One admitted connection: Describe -> Info, Transcript -> Handled/NotHandled, anything
    else ignored, until the client closes or hangs up, goes idle past the deadlines, or sends
    what is not an event (then one log line); never raises."""
    from wyoming.asr import Transcript
    from wyoming.event import async_write_event
    from wyoming.info import Describe
    if guard is None:
        from hivemind_chat_agent.core.peer_gate import AllowList
        guard = Guard(PeerGate(AllowList()))
    peer = peer or _host(writer.get_extra_info("peername"))
    first: Optional[bytes] = b""
    try:
        while first is not None:
            try:
                event = await read_event(reader, guard.deadlines, first)
            except BadEvent as e:
                guard.count("bad_event")
                guard.log("bad event", logging.WARNING,
                          f"Wyoming: closed a connection from {peer}: {e}")
                return
            except EventTimeout as e:
                guard.count("deadline")
                guard.log("deadline", logging.INFO,
                          f"Wyoming: closed a connection from {peer}: {e}")
                return
            if event is None:
                return
            first = b""
            if Describe.is_type(event.type):
                await async_write_event(bridge.info_event(), writer)
                guard.count("info")
            elif Transcript.is_type(event.type):
                first = await answer_watching(
                    reader, answer_transcript(bridge, guard, event.data, peer, writer))
                if first is None:
                    guard.count("hung_up")
                    guard.log("hung up", logging.DEBUG, f"Wyoming: {peer} hung up mid-turn; "
                                                        "its turn was stopped")
    except (ConnectionError, OSError):
        return
    finally:
        writer.close()


async def answer_watching(reader: asyncio.StreamReader, answering) -> Optional[bytes]:
    """Run `answering` (a coroutine writing the answer) while watching the connection. The
    peer closing it (or resetting it) first cancels the answer, which stops the turn; returns
    None then. Else the first byte of the peer's next event if it came meanwhile (the watch
    reads one byte only), or b"" (nothing came: the next event is read as usual).

    A peer that sends its next event before the answer is not watched further during this
    turn (the byte is kept, not read past); the turn's own timeout and the per-peer turn cap
    still bound it. A client that half-closes its side (shutdown(SHUT_WR)) right after its
    transcript is taken to have hung up, as HTTP servers take it: TCP cannot tell the two
    apart, and Home Assistant keeps its side open until it has the answer."""
    task = asyncio.ensure_future(answering)
    watch = asyncio.ensure_future(reader.read(1))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            came = _result(watch)
            if not came:                     # the caller hung up: stop its turn now
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                return None
            await task                       # it sent its next event already: answer first
            return came
        task.result()                        # a failed write raises here
        # answered; the byte the peer began its next event with, or b"" (the next read sees
        # the end of the stream, or a reset, again: reading took nothing from it)
        return _result(watch) if watch.done() else b""
    finally:
        for pending in (task, watch):
            if not pending.done():
                pending.cancel()             # a cancelled read(1) takes nothing from the stream
        await asyncio.gather(task, watch, return_exceptions=True)


async def answer_transcript(bridge: WyomingBridge, guard: Guard, data: dict, peer: str,
                            writer: asyncio.StreamWriter) -> None:
    """Write the answer to one Transcript event's `data`: NotHandled at once for one without
    text, or when no turn place comes for this peer in time; else the bridge's events."""
    from wyoming.event import async_write_event
    from wyoming.handle import NotHandled
    text, context, language = data.get("text"), data.get("context"), data.get("language")
    if not isinstance(text, str) or not text.strip():
        await async_write_event(NotHandled(text=SPOKEN["not_understood"]).event(), writer)
        guard.count("not_handled")
        return
    async with guard.turn_place(peer) as placed:
        if not placed:
            guard.log("turns", logging.WARNING,
                      f"Wyoming: {peer} has {guard.gate.caps.turns_per_peer} turns in flight "
                      f"and no place came in {guard.turn_wait:g} s: answered busy")
            await async_write_event(NotHandled(text=SPOKEN["busy"]).event(), writer)
            guard.count("busy")
            return
        async with contextlib.aclosing(bridge.answer(
                text, context if isinstance(context, dict) else {},
                language if isinstance(language, str) and len(language) <= MAX_LANGUAGE
                else None, peer)) as answers:
            last = None
            async for answer in answers:
                await async_write_event(answer, writer)
                last = answer.type
        if last is not None:        # the bridge ends with Handled (and HandledStop) or not
            guard.count("not_handled" if NotHandled.is_type(last) else "handled")


def _result(watch: "asyncio.Future") -> bytes:
    """What the hang-up watch read: b"" for the end of the stream or a reset."""
    if watch.cancelled() or watch.exception() is not None:
        return b""
    return watch.result()


def _host(peername) -> str:
    """The peer's address from a socket's peername (a tuple for IPv4/IPv6)."""
    if isinstance(peername, (tuple, list)) and peername:
        return str(peername[0])
    return str(peername or "?")


__all__ = ["Doorman", "Guard", "serve_connection", "answer_watching", "answer_transcript"]
