"""The asyncio API against genuine hivemind-core hubs of both generations (the OVOS-like test
pipeline answering): it never blocks the event loop, and works from inside a running one."""
import asyncio
import gc
import threading
import time

import pytest
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole

from hivemind_chat_agent import HiveMindChatAgent, HubUnreachableError, TurnStatus, TurnTimeoutError


def user(text):
    return [AgentMessage(role=MessageRole.USER, content=text)]


class LagProbe:
    """The event loop's worst scheduling lag: how late a 1 ms sleep wakes up, while it runs.
    Ticks during which the garbage collector ran are left out: a full collection stops every
    thread of the process (30 ms seen with 64 connections), whatever the loop does."""

    def __init__(self):
        self.worst = 0.0
        self._task = None
        self._gc_start = 0.0
        self._collections = []

    def _on_gc(self, phase, _info):
        if phase == "start":
            self._gc_start = time.monotonic()
        else:
            self._collections.append((self._gc_start, time.monotonic()))

    async def _tick(self):
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(0.001)
            end = loop.time()
            if not any(s < end and start < e for s, e in self._collections):
                self.worst = max(self.worst, end - start - 0.001)

    def __enter__(self):
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc):
        self._task.cancel()
        gc.callbacks.remove(self._on_gc)


def test_acontinue_chat_and_astream_sentences(creds, make_agent):
    agent = make_agent(creds.agent_config())

    async def main():
        with LagProbe() as lag:
            answer = await agent.acontinue_chat(user("count 3"), session_id="a-basic")
            streamed = []
            async for sentence in agent.astream_sentences(user("slow 3 0.1"),
                                                          session_id="a-basic"):
                streamed.append((sentence, time.monotonic()))
        return answer, streamed, lag.worst
    answer, streamed, worst = asyncio.run(main())
    assert answer.role == MessageRole.ASSISTANT
    assert answer.content == "sentence 1\nsentence 2\nsentence 3"
    assert [s for s, _ in streamed] == ["slow sentence 1", "slow sentence 2", "slow sentence 3"]
    assert streamed[-1][1] - streamed[0][1] >= 0.15      # each as it came, not all at the end
    assert worst < 0.1, f"the loop stalled {worst * 1000:.1f} ms"


def test_abegin_then_async_for_afull_response_and_a_coroutine_callback(creds, make_agent):
    agent = make_agent(creds.agent_config(timeout=10))
    loop_thread = []

    async def main():
        turn = await agent.abegin(user("count 3"), session_id="a-turn")
        got = [s async for s in turn]
        assert await turn.afull_response() == "\n".join(got)
        heard = []

        async def on_sentence(sentence):
            await asyncio.sleep(0)
            heard.append(sentence)
            loop_thread.append(threading.current_thread())
        with_cb = await agent.abegin(user("slow 3 0.05"), session_id="a-turn",
                                     callback=on_sentence)
        await with_cb.afull_response()
        asked = await agent.abegin(user("ask"), session_id="a-turn")
        await asked.afull_response()
        return turn, got, heard, with_cb, asked
    turn, got, heard, with_cb, asked = asyncio.run(main())
    assert got == ["sentence 1", "sentence 2", "sentence 3"]
    assert turn.status is TurnStatus.ANSWERED
    assert heard == ["slow sentence 1", "slow sentence 2", "slow sentence 3"]
    assert set(loop_thread) == {threading.main_thread()}   # ran on the loop, in order
    assert asked.status is TurnStatus.ASKED and asked.expect_response


def test_async_errors_and_terminate(creds, make_agent):
    agent = make_agent(creds.agent_config(timeout=1))

    async def main():
        with pytest.raises(TurnTimeoutError):
            await agent.acontinue_chat(user("silence"), session_id="a-err")
        turn = await agent.abegin(user("slow 8 0.2"), session_id="a-err")
        async for _ in turn:
            break
        with LagProbe() as lag:
            turn.terminate()          # on the loop's thread: it does not wait
            await turn.afull_response()
        return turn, lag.worst
    turn, worst = asyncio.run(main())
    assert turn.status is TurnStatus.CANCELLED
    assert worst < 0.1


def test_cancelling_the_awaiting_task_stops_the_turn(creds, make_agent):
    agent = make_agent(creds.agent_config(timeout=10))

    async def main():
        task = asyncio.ensure_future(agent.acontinue_chat(user("slow 10 0.2"),
                                                          session_id="a-cancel"))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        start = time.monotonic()
        answer = await agent.acontinue_chat(user("count 2"), session_id="a-cancel")
        return answer.content, time.monotonic() - start
    content, took = asyncio.run(main())
    assert content == "sentence 1\nsentence 2" and took < 1.5


def test_sixty_four_concurrent_async_turns_on_one_loop(creds, make_agent):
    # On a 4.0 hub 64 new sessions are 64 connections, whose password handshakes (PBKDF2 on
    # both sides) the hub runs one at a time: 10-13 s for the last one on a 2-core machine,
    # past the default connect_timeout. This test is about the event loop, not the hub.
    agent = make_agent(creds.agent_config(timeout=30, connect_timeout=40))

    async def one(k):
        turn = await agent.abegin(user("whoami"), session_id=f"a64-{k}")
        return [s async for s in turn], turn.status

    async def main():
        await agent.acontinue_chat(user("hello"), session_id="a64-warm")   # connected
        with LagProbe() as lag:
            start = time.monotonic()
            results = await asyncio.gather(*(one(k) for k in range(64)))
            took = time.monotonic() - start
        return results, took, lag.worst
    results, took, worst = asyncio.run(main())
    assert [r for r, _ in results] == [[f"session a64-{k}"] for k in range(64)]
    assert all(status is TurnStatus.ANSWERED for _, status in results)
    print(f"64 async turns: {took * 1000:.0f} ms, worst loop lag {worst * 1000:.2f} ms")
    # a guard against turns or connects blocking the loop (seconds), not a figure: 64 4.0
    # handshakes at once on 2 loaded cores left 20-180 ms of lag in runs of the same code;
    # the loop's lag is measured in benchmarks/ (<= 10 ms)
    assert worst < 0.5, f"the loop stalled {worst * 1000:.1f} ms"


@pytest.mark.parametrize("call", ["awarm_up", "abegin", "acontinue_chat", "astream_sentences"])
def test_every_async_method_raises_a_dead_hubs_error_instead_of_hanging(call):
    """A failure inside the worker reaches the awaiting task: the same typed error the
    blocking method raises, at once (nothing listens on port 1)."""
    agent = HiveMindChatAgent({"host": "ws://127.0.0.1", "port": 1, "key": "0" * 32,
                               "password": "x", "connect_timeout": 5})

    async def main():
        if call == "awarm_up":
            return await agent.awarm_up()
        if call == "astream_sentences":
            return [s async for s in agent.astream_sentences(user("hello"), "dead")]
        return await getattr(agent, call)(user("hello"), "dead")
    try:
        started = time.monotonic()
        with pytest.raises(HubUnreachableError):
            asyncio.run(asyncio.wait_for(main(), 15))
        assert time.monotonic() - started < 10
    finally:
        agent.shutdown()


def test_off_loop_hands_the_awaiting_task_what_the_work_raised_before_settling():
    from hivemind_chat_agent.background import off_loop

    def work(settle):
        raise ValueError("broken before settling")

    async def main():
        return await off_loop(work)
    with pytest.raises(ValueError, match="broken before settling"):
        asyncio.run(asyncio.wait_for(main(), 5))


def test_off_loop_abandons_a_result_that_came_just_before_the_task_was_cancelled():
    # the Wyoming front's hang-up, cancelling its task the moment the sent turn was handed
    # over: the result is set, the task is cancelled before it resumes, and the turn must
    # still be stopped. The loop is held (a blocking callback) until the worker has queued
    # both the result's hand-over and the cancel, so they run in that order, before the
    # task's wake-up that the hand-over schedules: left free, the loop could run the
    # hand-over and the wake-up before the worker queued the cancel
    from hivemind_chat_agent.background import off_loop
    abandoned = []
    queued = threading.Event()

    async def main():
        loop = asyncio.get_running_loop()
        task = None

        def work(settle):
            settle("the sent turn", None)
            loop.call_soon_threadsafe(task.cancel)
            queued.set()
        task = asyncio.ensure_future(off_loop(work, abandon=abandoned.append))
        loop.call_soon(queued.wait, 5)    # after the task's first step: it awaits by then
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(asyncio.wait_for(main(), 5))
    assert abandoned == ["the sent turn"]
