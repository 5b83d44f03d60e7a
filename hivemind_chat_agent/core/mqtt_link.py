"""`MqttGreeting`: what the MQTT transport must do that a websocket does by itself, without I/O.

hivemind-mqtt-protocol (0.2.5a2) gives every access key three topics under the hub's prefix:
`<prefix>/<key>/in` (satellite to hub), `<prefix>/<key>/out` (hub to satellite) and
`<prefix>/<key>/status` (retained presence, "online"/"offline", the satellite's last will).
Every "offline" drops the key's session on the hub, whoever says it, the hub included: it
announces each session it drops so, and reads that back; so we say HELLO only once the topic
has been quiet for `QUIET` s (`not_before`, across connections: the transport keeps it per key).
The frames on them are the websocket's frames: HELLO and HANDSHAKE in plain JSON, then Noise
transport messages. What differs, and is decided here from what the broker delivers and the
clock readings the transport passes in:

- the hub sees no connect: it files a connection under a key at the first frame on the key's
  `in` topic, then says HELLO and offers the handshake. So the satellite says HELLO first
  (`subscribed`), and again every `HELLO_EVERY` s until the hub's HELLO comes: a hub that is
  not yet (re)connected to the broker misses it, and a hub holding a stale session of this key
  (before a broker restart) drops that session on our plain HELLO, publishing "offline" on the
  key's status topic (`status`), which asks for the next HELLO at once;
- no close codes: a hub that does not know the key says nothing at all, so silence until
  `deadline` is a `HubSilentError` naming what to check (`tick`);
- the hub's session can end under a ready link without a word: its idle eviction (300 s of
  nothing from us by default), or another satellite on this key. The next frame we send then
  opens a new session there, which the hub answers with a plain HELLO (`frame`), or the hub
  says "offline" on the status topic; either is a `reset`: the link is over, and the turns that
  got nothing back never ran (the hub dropped their frames unread).
"""
import json
from dataclasses import dataclass
from enum import Enum
from typing import Optional, Union

from hivemind_chat_agent.errors import HiveMindChatError, HubSilentError

HELLO_EVERY = 1.0    # seconds between our HELLOs while the hub has not answered
# seconds of no "offline" on the key's status topic before we say HELLO: when a session of a
# key ends, hivemind-mqtt-protocol (0.2.5a2) publishes "offline" for the key and, reading its
# own message back a few ms later, drops whatever session the key has by then, so a HELLO said
# within that echo starts a session the echo ends (and its end echoes on in turn)
QUIET = 0.25
ONLINE, OFFLINE = "online", "offline"   # hivemind-mqtt-protocol's presence payloads


class Phase(str, Enum):
    CONNECTING = "connecting"   # the broker connection and subscriptions
    GREETING = "greeting"       # our HELLO is out; no HELLO of the hub's yet
    ANSWERED = "answered"       # the hub said HELLO: the handshake and the turns
    ENDED = "ended"


@dataclass(frozen=True)
class Topics:
    prefix: str
    key: str

    @property
    def inbound(self) -> str:        # the hub reads it
        return f"{self.prefix}/{self.key}/in"

    @property
    def outbound(self) -> str:       # the hub writes it
        return f"{self.prefix}/{self.key}/out"

    @property
    def status(self) -> str:
        return f"{self.prefix}/{self.key}/status"


def usable_key(key: str) -> bool:
    """The access key is a topic level on the hub: no separators or wildcards in it."""
    return bool(key) and not any(c in key for c in "/+#\0")


@dataclass(frozen=True)
class Step:
    """What the transport does after one input: publish our HELLO, tell its owner the link is
    open, hand a frame to the frame gate, end the link as reset (the reason), or fail."""
    hello: bool = False
    open: bool = False
    deliver: Optional[Union[str, bytes]] = None
    reset: str = ""
    fail: Optional[HiveMindChatError] = None


def _plain_type(raw: bytes) -> Optional[str]:
    """The type of a plain-JSON HiveMind frame ("hello", "handshake" ...), None for anything
    else (a Noise transport message is binary and never parses as such an object)."""
    if not raw[:1] == b"{":
        return None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    kind = obj.get("msg_type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None


class MqttGreeting:
    """One MQTT connection's greeting and its end, fed by the transport: `subscribed`,
    `frame`, `status`, `tick` with clock readings; each returns a `Step`."""

    def __init__(self, where: str, started: float, deadline: float):
        """`where`: the broker and topics, for messages; `deadline`: seconds from `started`
        within which the hub must have said HELLO."""
        self.where = where
        self.phase = Phase.CONNECTING
        self._deadline = started + deadline
        self._budget = deadline
        self._next_hello = float("inf")
        self.hellos = 0           # how many we sent

    def subscribed(self, now: float, not_before: float = 0.0) -> Step:
        """The broker granted our subscriptions: report the link open and say HELLO, unless
        an "offline" of this key was heard less than QUIET ago (`not_before`: then at it)."""
        if self.phase is not Phase.CONNECTING:
            return Step()
        self.phase = Phase.GREETING
        if now < not_before:
            self._next_hello = not_before
            return Step(open=True)
        return Step(hello=self._hello(now), open=True)

    def frame(self, raw: bytes, channel: bool) -> Step:
        """A frame on our `out` topic; `channel`: the handshake has installed its channel."""
        if self.phase in (Phase.CONNECTING, Phase.ENDED):
            return Step()
        kind = _plain_type(raw)
        if channel:
            if kind == "hello":
                return self._reset("the hub started a new session for this access key (it "
                                   "had dropped ours: idle eviction, a restart, or another "
                                   "satellite on this key)")
            return Step(deliver=bytes(raw))
        if kind is None:
            return Step(deliver=bytes(raw))
        if kind == "hello":
            if self.phase is Phase.ANSWERED:   # our handshake went to a session now gone
                return self._reset("the hub started another session for this access key "
                                   "during the handshake")
            self.phase = Phase.ANSWERED
        return Step(deliver=raw.decode("utf-8"))

    def status(self, payload: bytes, retained: bool, channel: bool, now: float) -> Step:
        """The key's presence topic. A retained value is history (ours or a past session's);
        a live "offline" is the hub dropping a session of this key."""
        if retained or payload.strip() != OFFLINE.encode() or self.phase is Phase.ENDED:
            return Step()
        if self.phase is Phase.GREETING:     # a session of the key ended (a stale one that
            self._next_hello = now + QUIET    # our HELLO dropped, or its echo): HELLO again
            return Step()                     # once the echoes are over
        if self.phase is Phase.ANSWERED:
            return self._reset("the hub closed this access key's session"
                               + ("" if channel else " during the handshake"))
        return Step()

    def tick(self, now: float) -> Step:
        """Time passed: HELLO again while the hub is silent, and give up at the deadline."""
        if self.phase is Phase.GREETING:
            if now >= self._deadline:
                self.phase = Phase.ENDED
                return Step(fail=HubSilentError(
                    f"no HiveMind hub answered through the MQTT broker {self.where} within "
                    f"{self._budget:g} s. Over MQTT a hub says nothing to an access key it does "
                    "not know: check that the key is registered on the hub (`hivemind-core "
                    "list-clients`), that topic_prefix is the hub's, and that the hub's "
                    "hivemind-mqtt-protocol is connected to this broker"))
            if now >= self._next_hello:
                return Step(hello=self._hello(now))
        return Step()

    def ended(self) -> None:
        self.phase = Phase.ENDED

    def _hello(self, now: float) -> bool:
        self._next_hello = now + HELLO_EVERY
        self.hellos += 1
        return True

    def _reset(self, reason: str) -> Step:
        self.phase = Phase.ENDED
        return Step(reset=reason)
