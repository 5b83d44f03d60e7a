"""Speech an engine says between turns (`subscribe(session_id, callback)`, as
`HiveMindChatAgent` relaying to another hub does: alarms, reminders, late answers), forwarded
to the satellite session it belongs to, on that satellite's latest connection."""
from dataclasses import dataclass
from threading import Lock
from typing import Any, Callable, Dict

from ovos_bus_client.message import Message
from ovos_utils.log import LOG

from hivemind_chat_agent.core.limits import shown_name
from hivemind_chat_agent.core.protocol_names import SPEAK_TYPE
from hivemind_chat_agent.hub.settings import PLUGIN_NAME


@dataclass
class _Aside:
    """Where an engine session's speech between turns goes: its satellite's latest connection."""
    client: Any
    peer: str
    loop: Any
    satellite_session: Dict[str, Any]
    subscription: Any = None


class Asides:
    def __init__(self, engine: Any, send: Callable[[Any, str, Message], None]):
        """`send(client, peer, reply)` writes on the IO loop."""
        self._engine = engine
        self._send = send
        self._lock = Lock()     # workers (follow) vs the IO loop (stop, as sessions go)
        self._by_session: Dict[str, _Aside] = {}

    def follow(self, turn: Any) -> None:
        """Worker thread, before a turn: subscribe once per satellite session (engines that
        can speak between turns only)."""
        subscribe = getattr(self._engine, "subscribe", None)
        if not callable(subscribe):
            return
        with self._lock:
            aside = self._by_session.get(turn.session_id)
            if aside is not None:
                aside.client, aside.peer = turn.client, turn.peer
                aside.satellite_session = turn.satellite_session
                return
            aside = self._by_session[turn.session_id] = _Aside(
                turn.client, turn.peer, turn.loop, turn.satellite_session)
        try:
            aside.subscription = subscribe(
                turn.session_id, callback=lambda text: self._forward(aside, text))
        except Exception as e:   # the turn itself reports an unreachable upstream
            LOG.info(f"not following speech between turns of {shown_name(turn.peer)}: "
                     f"{type(e).__name__}")
            with self._lock:
                self._by_session.pop(turn.session_id, None)

    def _forward(self, aside: _Aside, text: str) -> None:
        sat = aside.satellite_session
        ctx = {"source": PLUGIN_NAME, "destination": aside.peer, "session": dict(sat)}
        reply = Message(SPEAK_TYPE, {"utterance": text, "expect_response": False,
                                     "lang": sat.get("lang") or "en-US",
                                     "meta": {"skill": PLUGIN_NAME}}, ctx)
        aside.loop.add_callback(self._send, aside.client, aside.peer, reply)

    def stop(self, session_id: str) -> None:
        with self._lock:
            aside = self._by_session.pop(session_id, None)
        if aside is not None and aside.subscription is not None:
            aside.subscription.close()

    def stop_all(self) -> None:
        with self._lock:
            following = list(self._by_session)
        for session_id in following:
            self.stop(session_id)
