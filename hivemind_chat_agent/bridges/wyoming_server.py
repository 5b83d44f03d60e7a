"""`hivemind-chat wyoming`: Home Assistant's Assist talks to an OVOS hub through Wyoming.

Home Assistant's built-in Wyoming integration turns a Wyoming "handle" service into a
conversation agent (homeassistant/components/wyoming/conversation.py): per turn it opens a TCP
connection, sends `Transcript(text, context={conversation_id, device_id?, satellite_id?},
language)`, and reads events until `Handled(text)` or `NotHandled(text)`, skipping any others.
Each transcript is one turn of `HiveMindChatAgent` (bridges/wyoming_bridge.py).

Wyoming has no authentication: whoever reaches the port is answered as this client of the
hub. So the server admits only the peers of its allow list (`--allow-from`; loopback peers
only on a loopback bind without one), and refuses to start beyond loopback without one; it
caps connections in total and per peer, closes idle and slow ones, and stops the turn of a
caller that hangs up (bridges/wyoming_connection.py, core/peer_gate.py).

`hivemind-chat wyoming`'s options and its start are bridges/wyoming_cli.py's.
"""
import asyncio
from typing import Optional

from hivemind_chat_agent.bridges.wyoming_bridge import SPOKEN, WyomingBridge, session_for
from hivemind_chat_agent.bridges.wyoming_connection import Doorman, Guard, serve_connection
from hivemind_chat_agent.bridges.wyoming_events import (
    MAX_DATA,
    MAX_LINE,
    BadEvent,
    Deadlines,
    read_event,
)
from hivemind_chat_agent.core.peer_gate import AllowList, Caps, PeerGate
from hivemind_chat_agent.extras import install_hint


async def _drained(tasks: set) -> None:
    """Until every connection task of `tasks` has ended (those begun meanwhile too)."""
    while True:
        pending = [task for task in tasks
                   if not task.done() and task is not asyncio.current_task()]
        if not pending:
            return
        await asyncio.wait(pending)


def default_guard(bridge: WyomingBridge, host: str) -> Guard:
    """The guard of a server given none: loopback peers only, the default caps and deadlines;
    beyond loopback a ConfigurationError (Wyoming has no authentication: say who may connect).
    A turn waits for a place at most the agent's own timeout."""
    allow = AllowList.for_bind(host, (), "the Wyoming server", "--allow-from 192.168.1.20")
    return Guard(PeerGate(allow, Caps()), Deadlines(), turn_wait=turn_wait_of(bridge))


def turn_wait_of(bridge: WyomingBridge) -> float:
    settings = getattr(bridge.agent, "settings", None)
    return float(getattr(settings, "timeout", 30.0))


async def advertise(port: int, host: str, name: Optional[str]) -> Optional[str]:
    """Announce `_wyoming._tcp` over mDNS, as other Wyoming servers do, so Home Assistant
    discovers the service; None when announced, else why not (the server serves anyway)."""
    import importlib.util
    if host.startswith("127.") or host == "localhost":
        return (f"not announced: {host} is reachable from this machine only; listen on "
                "0.0.0.0 or a LAN address for Home Assistant to find it")
    if importlib.util.find_spec("zeroconf") is None:
        return (f"discovery needs the [zeroconf] extra ({install_hint('zeroconf')}); add "
                "the Wyoming integration in Home Assistant by host and port instead")
    from wyoming.zeroconf import HomeAssistantZeroconf
    try:
        announcer = HomeAssistantZeroconf(port=port, name=name or None,
                                          host=None if host in ("", "0.0.0.0") else host)
        await announcer.register_server()
    except OSError as e:
        return (f"multicast is unavailable here ({e.strerror or e}); add the Wyoming "
                "integration in Home Assistant by host and port instead")
    return None


async def run_server(bridge: WyomingBridge, host: str, port: int,
                     started: Optional[asyncio.Future] = None,
                     zeroconf: Optional[str] = None,
                     say=lambda text: None, warm: bool = False,
                     guard: Optional[Guard] = None,
                     stopping: Optional[asyncio.Event] = None) -> None:
    """Serve until cancelled, or until `stopping` is set (bridges/serving's stop signal):
    then no new connection is accepted and those open end as their peers close them (a turn
    in flight is answered first); cancelled meanwhile, they end at once. `zeroconf`: announce
    under that name ("" for the default); `warm`: connect to the hub at once
    (`WyomingBridge.warm_up`) while serving; `guard`: who may connect, the caps and deadlines
    (default_guard: loopback peers only)."""
    guard = guard or default_guard(bridge, host)
    tasks: set = set()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Doorman(bridge, guard, tasks), host=host,
                                      port=port)
    if started is not None and not started.done():
        started.set_result(server.sockets[0].getsockname()[1])
    if warm:
        tasks.add(asyncio.create_task(bridge.warm_up(say)))
    if zeroconf is not None:
        why_not = await advertise(port, host, zeroconf)
        say(why_not or f"announced on the network as {zeroconf or 'this machine'} "
                       "(_wyoming._tcp): Home Assistant offers to add it")
    try:
        async with server:
            if stopping is None:
                await server.serve_forever()
            else:
                await server.start_serving()
                await stopping.wait()
                server.close()                       # no new connections
                await _drained(tasks)
    finally:       # stopping: the connections in progress end with the server
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["WyomingBridge", "run_server", "serve_connection", "session_for", "Guard",
           "Doorman", "SPOKEN", "read_event", "BadEvent", "Deadlines", "AllowList", "Caps",
           "PeerGate", "default_guard", "MAX_LINE", "MAX_DATA"]
