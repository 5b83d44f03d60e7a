"""`ask` within the caller's time budget (`hivemind-chat mcp --tool-timeout`).

MCP clients give a tool call a budget (Home Assistant: 10 s, and a new MCP session per call).
Each turn runs in a task of its own (its "pump") that feeds core/pending_answers.PendingAnswers;
an `ask` waits for the turn's end at most `budget` seconds, then returns what was said so far.
Still speaking, the result says `complete: false` and the turn goes on at the hub; the next
`ask` of that caller and conversation with an empty utterance returns what came since (again
within the budget), until one says `complete: true`. Nothing depends on the MCP session: the
turn is found by the caller (its API key) and the conversation the tool names.

A turn nobody comes back for is stopped at the hub and forgotten `keep_for` seconds after its
last portion; a caller keeps at most `per_caller` such turns (the oldest is stopped for a
new one); a new utterance in a conversation stops the turn pending there, as a person talking
over the assistant does. A caller who hangs up during an `ask` stops its turn.
"""
import asyncio
import time
from typing import Any, Dict, Optional

from hivemind_chat_agent.core.pending_answers import PendingAnswers, Portion
from hivemind_chat_agent.errors import HiveMindChatError

MAX_CONVERSATION = 200      # bytes (UTF-8) of a conversation name: its session id, with the
                            # caller's name, stays within core/limits.MAX_ID_BYTES
DEFAULT_BUDGET = 8.0        # seconds: within Home Assistant's 10 s per tool call
DEFAULT_KEEP_FOR = 60.0     # seconds an unfinished answer waits to be collected
DEFAULT_PER_CALLER = 4      # unfinished answers kept per caller


class BudgetedAsks:
    """The `ask` tool's turns: `ask()` per call, the pumps, the sweeping of forgotten turns.
    Runs on one event loop (the MCP server's)."""

    def __init__(self, agent, budget: float = DEFAULT_BUDGET,
                 keep_for: float = DEFAULT_KEEP_FOR, per_caller: int = DEFAULT_PER_CALLER):
        if not budget > 0:
            raise ValueError("the tool's time budget must be above 0 seconds")
        self.agent = agent
        self.budget = budget
        self.book = PendingAnswers(time.monotonic, keep_for, per_caller)
        self._pumps: Dict[int, "asyncio.Task[None]"] = {}
        self._sweep: Optional[asyncio.TimerHandle] = None

    async def ask(self, utterance: str, conversation: str, caller: str = "") -> Dict[str, Any]:
        """One call: a new turn for a non-empty `utterance`, the rest of the pending one for an
        empty one. The structured result {"answer", "expect_response", "conversation",
        "complete"}. Raises ValueError for an empty utterance with nothing pending or a name
        too long, and HiveMindChatError for a turn that failed having said nothing."""
        if len(conversation.encode()) > MAX_CONVERSATION:
            raise ValueError(f"a conversation name has at most {MAX_CONVERSATION} bytes of UTF-8")
        deadline = asyncio.get_running_loop().time() + self.budget
        if utterance and utterance.strip():
            token = self._begin(utterance, conversation, caller)
        else:
            found = self.book.find(caller, conversation)
            if found is None or not self.book.collect(found):
                raise ValueError("utterance must not be empty (an empty one collects the rest "
                                 f"of an unfinished answer, and conversation {conversation!r} "
                                 "has none)")
            token = found
        portion = await self._collect(token, deadline)
        if portion.error is not None:
            raise portion.error
        return {"answer": "\n".join(portion.sentences),
                "expect_response": portion.expect_response, "conversation": conversation,
                "complete": portion.complete}

    def _begin(self, utterance: str, conversation: str, caller: str) -> int:
        token, dropped = self.book.begin(caller, conversation)
        for gone in dropped:
            self._stop(gone)
        session = f"mcp:{caller}:{conversation}" if caller else f"mcp:{conversation}"
        self._pumps[token] = asyncio.ensure_future(self._pump(token, utterance, session))
        return token

    async def _pump(self, token: int, utterance: str, session: str) -> None:
        """The turn, from its start to its end, told to the book; cancelled, the turn is
        stopped at the hub (terminate: a no-op once it has ended)."""
        turn = None
        try:
            turn = await self.agent.abegin([{"role": "user", "content": utterance}],
                                           session_id=session)
            async for sentence in turn:
                self.book.said(token, sentence)
            self.book.ended(token, bool(turn.expect_response), turn.get_exception())
        except HiveMindChatError as e:
            self.book.ended(token, error=e)
        finally:
            if turn is not None:
                turn.terminate()

    async def _collect(self, token: int, deadline: float) -> Portion:
        """Wait for the turn's end until `deadline`, then take its portion. Cancelled (the
        caller hung up), the turn is stopped and forgotten."""
        loop = asyncio.get_running_loop()
        pump = self._pumps.get(token)
        try:
            if pump is not None and not self.book.is_over(token):
                await asyncio.wait({pump}, timeout=max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            self.book.drop(token)
            self._stop(token)
            raise
        portion = self.book.take(token)
        if portion is None:          # replaced meanwhile by a newer utterance, or dropped
            return Portion((), True)
        if portion.complete:
            self._pumps.pop(token, None)
        else:
            self._schedule_sweep()
        return portion

    def _stop(self, token: int) -> None:
        pump = self._pumps.pop(token, None)
        if pump is not None and not pump.done():
            pump.cancel()

    def _schedule_sweep(self) -> None:
        """Look again at the earliest deadline of an uncollected turn."""
        due = self.book.next_deadline()
        if due is None:
            return
        if self._sweep is not None:
            self._sweep.cancel()
        loop = asyncio.get_running_loop()
        self._sweep = loop.call_later(max(0.0, due - time.monotonic()) + 0.01, self._swept)

    def _swept(self) -> None:
        self._sweep = None
        for token in self.book.expired():
            self._stop(token)
        self._schedule_sweep()


__all__ = ["BudgetedAsks", "MAX_CONVERSATION", "DEFAULT_BUDGET", "DEFAULT_KEEP_FOR",
           "DEFAULT_PER_CALLER"]
