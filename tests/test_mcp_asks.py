"""bridges/mcp_asks.BudgetedAsks, the `ask` tool's turns, on an event loop with turns the test
scripts (no hub: the real-hub run is tests/test_mcp_server.py). What is checked is the wiring
around core/pending_answers: the budget returns a part and the turn goes on, an empty
utterance collects the rest, and every way a turn is given up (its caller hangs up, a new
utterance, nobody comes back, the caller's cap) stops it (`terminate`). The turns here never
end by themselves, so no assertion depends on how fast the machine is."""
import asyncio

import pytest

from hivemind_chat_agent.bridges.mcp_asks import BudgetedAsks
from hivemind_chat_agent.errors import HubUnreachableError


class ScriptedTurn:
    """A ChatTurn's asyncio side: sentences and the end come when the test says."""

    def __init__(self, utterance):
        self.utterance = utterance
        self.queue: asyncio.Queue = asyncio.Queue()
        self.expect_response = False
        self.error = None
        self.terminated = False

    def say(self, *sentences, end=False, asked=False):
        for sentence in sentences:
            self.queue.put_nowait(sentence)
        if end:
            self.expect_response = asked
            self.queue.put_nowait(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item

    def get_exception(self):
        return self.error

    def terminate(self):
        self.terminated = True


class ScriptedAgent:
    """`abegin` as HiveMindChatAgent's; `first`: what each turn has said as it begins."""

    def __init__(self, fail=None, first=()):
        self.turns = []
        self.sessions = []
        self.fail = fail
        self.first = first

    async def abegin(self, messages, session_id):
        if self.fail is not None:
            raise self.fail
        turn = ScriptedTurn(messages[-1]["content"])
        turn.say(*self.first)
        self.turns.append(turn)
        self.sessions.append(session_id)
        return turn


async def until(condition, within=10.0):
    """`condition()` once true, polled on the loop; an upper bound only a failure reaches."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + within
    while not condition() and loop.time() < ends:
        await asyncio.sleep(0.005)
    return condition()


BUDGET = 0.05      # the turns here speak only when told: the budget always passes first


def test_a_part_at_the_budget_then_the_rest_with_an_empty_utterance():
    async def main():
        agent = ScriptedAgent(first=["once upon a time"])
        asks = BudgetedAsks(agent, budget=BUDGET)
        first = await asks.ask("tell a story", "story", "key-a")
        assert first == {"answer": "once upon a time", "expect_response": False,
                         "conversation": "story", "complete": False}
        assert agent.sessions == ["mcp:key-a:story"]
        agent.turns[0].say("there was a hub", "the end", end=True, asked=True)
        rest = await asks.ask("", "story", "key-a")
        assert rest == {"answer": "there was a hub\nthe end", "expect_response": True,
                        "conversation": "story", "complete": True}
        with pytest.raises(ValueError, match="has none"):
            await asks.ask("", "story", "key-a")          # collected: nothing left
    asyncio.run(main())


def test_the_rest_is_found_by_caller_and_conversation_only():
    async def main():
        agent = ScriptedAgent()
        asks = BudgetedAsks(agent, budget=BUDGET)
        await asks.ask("long", "c", "key-a")
        for caller, conversation in (("key-b", "c"), ("key-a", "other")):
            with pytest.raises(ValueError, match="has none"):
                await asks.ask("", conversation, caller)
        agent.turns[0].say("done", end=True)
        assert (await asks.ask("  ", "c", "key-a"))["answer"] == "done"
    asyncio.run(main())


def test_every_turn_given_up_is_stopped():
    async def main():
        agent = ScriptedAgent()
        asks = BudgetedAsks(agent, budget=BUDGET, keep_for=600.0, per_caller=1)
        # the caller hangs up during its ask
        asking = asyncio.ensure_future(asks.ask("hung up", "a", "key-a"))
        assert await until(lambda: agent.turns)
        asking.cancel()
        assert await until(lambda: agent.turns[0].terminated)
        # a new utterance in the conversation replaces the unfinished answer there
        await asks.ask("first", "b", "key-a")
        await asks.ask("second", "b", "key-a")
        assert await until(lambda: agent.turns[1].terminated)
        assert not agent.turns[2].terminated
        # the caller's cap (1): a new conversation stops the oldest unfinished one
        await asks.ask("third", "c", "key-a")
        assert await until(lambda: agent.turns[2].terminated)
        assert not agent.turns[3].terminated
        await asks.ask("other caller", "c", "key-b")          # not counted against key-a
        assert not agent.turns[3].terminated
    asyncio.run(main())


def test_an_unfinished_answer_nobody_comes_back_for_is_stopped_and_forgotten():
    async def main():
        agent = ScriptedAgent(first=["part one"])
        asks = BudgetedAsks(agent, budget=BUDGET, keep_for=0.2)
        assert (await asks.ask("long", "c", "key-a"))["complete"] is False
        assert await until(lambda: agent.turns[0].terminated)
        with pytest.raises(ValueError, match="has none"):
            await asks.ask("", "c", "key-a")
        assert len(asks.book) == 0
    asyncio.run(main())


def test_a_turn_that_fails_having_said_nothing_is_the_error():
    async def main():
        asks = BudgetedAsks(ScriptedAgent(fail=HubUnreachableError("no hub")), budget=5.0)
        with pytest.raises(HubUnreachableError):
            await asks.ask("hello", "c")
        with pytest.raises(ValueError, match="at most"):
            await asks.ask("hello", "x" * 201)
    asyncio.run(main())
