"""What the client tells the hub besides its utterances, as a satellite does: that a sentence has
been played (`recognizer_loop:audio_output_end`) and that an answer must stop (`mycroft.stop`),
and which of these the hub's policy refuses.

One `SatelliteReports` per connection. It sends through the connection's `emit` and asks it
whether a session's turn is still open; it owns no socket and no turn.
"""
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional

from ovos_bus_client.message import Message
from ovos_bus_client.session import SessionManager
from ovos_utils.log import LOG

from hivemind_chat_agent.background import SYSTEM_CLOCK
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.protocol_names import AUDIO_OUTPUT_END_TYPE, STOP_TYPE, TURN_TAG_KEY
from hivemind_chat_agent.errors import HiveMindChatError

AUDIO_END_ECHO = 0.25      # seconds before the first repeat; see SatelliteReports.echo_later
AUDIO_END_ECHO_MAX = 1.0   # the longest gap between repeats while the turn stays open
MAX_STOPS_AWAITED = 16     # stopped turns whose "<skill>.stop.response" we still listen for

# What is lost where a hub's policy refuses each of them.
REFUSED = {
    AUDIO_OUTPUT_END_TYPE: "skills that speak with wait=True will wait for their own timeout",
    STOP_TYPE: "a stopped turn (terminate(), barge-in) ends here, but the hub's skills finish "
               "their answer",
}


class SatelliteReports:
    def __init__(self, emit: Callable[[Message], None], wire: Callable[[Any], Dict[str, Any]],
                 source: str, turn_open: Callable[[str], bool], usable: Callable[[], bool],
                 clock: Clock = SYSTEM_CLOCK):
        self._clock = clock
        self._emit = emit              # sends one BUS message, raising HiveMindChatError
        self._wire = wire              # a Session as it goes on the wire
        self._source = source
        self._turn_open = turn_open    # the session has a turn in progress, or a question
        # whose skill has not said it listens (CarriedTurns.awaits_audio_end)
        self._usable = usable          # the connection is ready and not closed
        self._lock = threading.Lock()
        self._refused: set = set()
        self._echoes: Dict[str, Optional[str]] = {}          # session -> tag, to repeat
        self._stopping: "OrderedDict[str, Callable[[str], None]]" = OrderedDict()

    def _send(self, msg_type: str, session_id: str, tag: Optional[str]) -> bool:
        sess = SessionManager.sessions.get(session_id)
        if sess is None or msg_type in self._refused or not self._usable():
            return False
        context = {"session": self._wire(sess), "source": self._source,
                   "destination": "HiveMind"}
        if tag is not None:
            context[TURN_TAG_KEY] = tag
        try:
            self._emit(Message(msg_type, {}, context))
            return True
        except HiveMindChatError as e:
            LOG.debug(f"could not send {msg_type}: {e}")
            return False

    # ---- audio end ----
    def audio_end(self, session_id: str, tag: Optional[str] = None) -> None:
        """This session's speech has been played: skills that spoke with wait=True go on."""
        self._send(AUDIO_OUTPUT_END_TYPE, session_id, tag)

    def echo_later(self, session_id: str, tag: Optional[str],
                   delay: Optional[float] = None) -> None:
        """Report the audio end once more, `delay` later (once per session, however many
        sentences came meanwhile), and again at gaps doubling up to AUDIO_END_ECHO_MAX while
        that session's turn stays open. Reported at once, it can reach ovos-core before the
        skill's `wait_while_speaking` listens for it (ovos-bus-client 2.x checks the session's
        speaking flag, then subscribes), and the skill would wait out its 15 s timeout; the
        repeats cover a late listener (measurements: docs/performance.md). A text client plays
        nothing: "audio ended" is always true, and a repeat costs one small frame."""
        delay = AUDIO_END_ECHO if delay is None else delay
        with self._lock:
            fresh = not self._echoes
            self._echoes[session_id] = tag
        if fresh:
            self._clock.call_later(delay, lambda: self._echo(delay))

    def _echo(self, delay: float) -> None:
        """Only for turns still open (or a question whose skill does not listen yet): once
        `handled` came, no skill of the turn waits any more, and a frame more is a frame that
        a stock 4.0 hub plugin may be forwarding while another client connects (the race
        churn_gate keeps turns away from)."""
        with self._lock:
            echoes, self._echoes = self._echoes, {}
        for session_id, tag in echoes.items():
            if self._usable() and self._turn_open(session_id):
                self.audio_end(session_id, tag)
                self.echo_later(session_id, tag, min(delay * 2, AUDIO_END_ECHO_MAX))

    # ---- stop ----
    def stop(self, session_id: str, tag: str,
             on_stopped: Callable[[str], None] = lambda skill: None) -> None:
        """Barge-in: `mycroft.stop` carrying the session, tagged with the turn, as OVOS stops
        an answer. `on_stopped(skill_id)` (socket thread) when a skill or the hub's engine
        answers that it stopped."""
        with self._lock:
            self._stopping[tag] = on_stopped
            while len(self._stopping) > MAX_STOPS_AWAITED:
                self._stopping.popitem(last=False)
        if not self._send(STOP_TYPE, session_id, tag):
            with self._lock:
                self._stopping.pop(tag, None)

    def stopped(self, tag: Optional[str], skill_id: str) -> None:
        """A "<skill>.stop.response" with result true arrived for `tag`."""
        with self._lock:
            on_stopped = self._stopping.pop(tag or "", None)
        if on_stopped is not None:
            on_stopped(skill_id)

    # ---- the hub's policy ----
    def refused(self, msg_type: str) -> bool:
        """`hive.policy.denied` for `msg_type`: True if it is one of ours (then never sent
        again on this connection, and named once in a WARNING with the operator's command)."""
        if msg_type not in REFUSED:
            return False
        with self._lock:
            first = msg_type not in self._refused
            self._refused.add(msg_type)
        if first:
            LOG.warning(f"the hub does not allow this client to send {msg_type}; "
                        f"{REFUSED[msg_type]}. The hub's operator can run "
                        f"`hivemind-core allow-msg {msg_type} NODE_ID`")
        return True
