"""Home Assistant's side of a Wyoming conversation, for tests: the real `wyoming` client
library driven as homeassistant/components/wyoming/conversation.py drives it (`Describe` ->
`Info` once, then one TCP connection per turn carrying `Transcript(text, context={
conversation_id, device_id, satellite_id}, language)`, read until `Handled` / `NotHandled`),
and our server run as `hivemind-chat wyoming` runs it."""
import asyncio
import threading

from hubs import free_port
from waiting import accepting, wait_until
from wyoming.asr import Transcript
from wyoming.client import AsyncTcpClient
from wyoming.handle import Handled, NotHandled
from wyoming.info import Describe, Info

from hivemind_chat_agent.bridges.wyoming_server import WyomingBridge, run_server


class Server:
    """run_server on an event loop of its own thread, as `hivemind-chat wyoming` runs it."""

    def __init__(self, agent, **options):
        self.port = free_port()
        self.bridge = WyomingBridge(agent, version="test", **options)
        self.loop = asyncio.new_event_loop()
        self._task = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not wait_until(lambda: accepting(self.port), 10):
            raise RuntimeError("the Wyoming server did not start")

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self._task = self.loop.create_task(run_server(self.bridge, "127.0.0.1", self.port))
        try:
            self.loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass

    def stop(self):
        self.loop.call_soon_threadsafe(self._task.cancel)
        self.thread.join(5)


async def ha_turn(port, text, conversation_id="c1", device_id="dev-1", satellite_id=None,
                  language="en-US", read_timeout=30):
    """One Assist turn as Home Assistant runs it: a connection, a Transcript, the answer."""
    context = {"conversation_id": conversation_id}
    if device_id:
        context["device_id"] = device_id
    if satellite_id:
        context["satellite_id"] = satellite_id
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcript(text, context=context, language=language).event())
        while True:
            event = await asyncio.wait_for(client.read_event(), read_timeout)
            if event is None:
                raise ConnectionError("the server closed the connection without an answer")
            if Handled.is_type(event.type):
                return Handled.from_event(event)
            if NotHandled.is_type(event.type):
                return NotHandled.from_event(event)


def turn(port, text, **kw):
    return asyncio.run(ha_turn(port, text, **kw))


async def describe(port):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 10)
            if Info.is_type(event.type):
                return Info.from_event(event)


async def streamed_turn(port, text, conversation_id="s1"):
    """A client that takes streamed answers: every event until HandledStop or NotHandled
    (a streamed answer's Handled comes before its HandledStop: read past it)."""
    events = []
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcript(text, context={"conversation_id": conversation_id},
                                            language="en-US").event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 30)
            if event is None:
                raise ConnectionError(f"the server closed the connection after {events}")
            events.append(event)
            if event.type in ("handled-stop", "not-handled"):
                return events


def load_phases(port, prefix, utterance, answered, read_timeout=30):
    """Home Assistant's load on one hub (issue 20): 20 new conversations one after another,
    20 at once, then 40 turns of the first 20. `utterance(phase, i)` is what is said,
    `answered(said, reply_text)` whether the reply is its answer; returns the turns that got
    none, as (conversation, said, what came instead)."""
    lost = []

    async def one(phase, i, conversation):
        said = utterance(phase, i)
        result = await ha_turn(port, said, conversation_id=conversation,
                               read_timeout=read_timeout)
        if not (isinstance(result, Handled) and answered(said, result.text or "")):
            lost.append((conversation, said, getattr(result, "text", result)))

    async def phases():
        for i in range(20):
            await one("first", i, f"{prefix}-one-after-another-{i}")
        await asyncio.gather(*(one("at once", i, f"{prefix}-at-once-{i}") for i in range(20)))
        for i in range(40):
            await one("steady", i, f"{prefix}-one-after-another-{i % 20}")
    asyncio.run(phases())
    return lost
