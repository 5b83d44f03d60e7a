"""`HubLink`: the protocol state of one connection to a hub, without I/O.

One explicit state machine, in the manner of a sans-I/O protocol object: the socket layer
(client/connection.py) feeds it what happened (`opened`, `frame_received`, `closed`, `failed`,
`untrusted`) and carries out the `Decision` each call returns: frames to send, a channel to
install, a BUS payload for the turns, the refusal to raise, the turns to lose, the socket to
close. It never blocks, sleeps, reads a clock or touches a socket, so every path (the
handshake of either generation, a refusal before or after it, a tampered frame) is tested by
calling it (tests/test_hub_link.py).

    CONNECTING --opened--> HANDSHAKING --channel--> READY
         \\                     \\                     \\
          `------ failed / closed / untrusted ---------`--> CLOSED (terminal)

Only READY carries turns. CLOSED keeps the first error that explains it (`error`), which a
send that raced the close raises in its stead.
"""
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

from hivemind_bus_client.message import HiveMessage, HiveMessageType

from hivemind_chat_agent.core.exchange import ExchangeInputs, KeyExchange, SecureChannel
from hivemind_chat_agent.core.frames import Opened
from hivemind_chat_agent.core.handshake import choose
from hivemind_chat_agent.core.refusals import (
    closed_before_ready,
    refusal_after_noise_handshake,
    refusal_from_close,
    untrusted_frame,
)
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import HiveMindChatError, HubSessionDroppedError


class LinkState(str, Enum):
    CONNECTING = "connecting"     # the socket is not open yet
    HANDSHAKING = "handshaking"   # open; the hub's HELLO and the key exchange
    READY = "ready"               # encrypted both ways: turns may be sent
    CLOSED = "closed"             # for good (by us, the hub, or a failure)


@dataclass
class Decision:
    """What the socket layer does after one input, in this order: send `send` as they are
    (handshake messages, before any channel), install `channel`, send `then_send` through it,
    hand `bus` to the turns, end the turns (`refuse_turns` with that error, or `lose_turns`
    with (reason, EndReason)), and close the socket if `close`. `failed` is set when the
    link closed before it was ready (a connect in progress raises it)."""
    send: List[HiveMessage] = field(default_factory=list)
    channel: Optional[SecureChannel] = None
    then_send: List[HiveMessage] = field(default_factory=list)
    bus: Any = None
    failed: Optional[HiveMindChatError] = None
    refuse_turns: Optional[HiveMindChatError] = None
    lose_turns: Optional[Tuple[str, EndReason]] = None
    close: bool = False
    unsent: bool = False     # lost turns that got nothing back never reached the hub


class HubLink:
    def __init__(self, inputs: ExchangeInputs, site_id: str = "",
                 hello_session: Optional[Dict[str, Any]] = None):
        self._inputs = inputs
        self._site_id = site_id or "unknown"
        self.hello_session = hello_session     # None: a spare, said at claim()
        self.state = LinkState.CONNECTING
        self.error: Optional[HiveMindChatError] = None
        self.generation = ""             # which handshake the hub spoke, once it has
        self.many_sessions = False       # the hub reads each message's Session (5.x)
        self.hub_spoke = False           # some message arrived since the channel
        self._hello: Optional[Dict[str, Any]] = None     # the hub's cleartext HELLO
        self._exchange: Optional[KeyExchange] = None
        self._opened = False

    # ---- what the socket layer reports ----
    def opened(self) -> Decision:
        if self.state is LinkState.CONNECTING:
            self.state, self._opened = LinkState.HANDSHAKING, True
        return Decision()

    def frame_received(self, message: HiveMessage) -> Decision:
        if self.state is LinkState.CLOSED:
            return Decision()
        if self.state is LinkState.READY:
            self.hub_spoke = True
        if message.msg_type == HiveMessageType.BUS:
            return Decision(bus=message.payload) if self.state is LinkState.READY \
                else Decision()
        if message.msg_type == HiveMessageType.HANDSHAKE:
            return self._handshake(message.payload)
        if message.msg_type == HiveMessageType.HELLO:
            if self._hello is None and isinstance(message.payload, dict):
                self._hello = dict(message.payload)   # the Noise prologue binds it
        return Decision()

    def closed(self, code: Any = None, reason: str = "", broken: Any = None) -> Decision:
        """The socket closed (`code`, `reason` of the hub's close frame, if any) or broke
        (`broken`: the error of a corrupted stream)."""
        if self.state is LinkState.CLOSED:
            return Decision()
        refusal = refusal_from_close(code, reason)
        if refusal is None and code == 1008 and self.many_sessions and not self.hub_spoke:
            # A 5.x hub checks our static key against its pin only after the last handshake
            # message and answers nothing on success; its close often says only "invalid
            # message". Nothing else closes a fresh v3 connection before its first answer.
            refusal = refusal_after_noise_handshake(reason)
        if self.state is not LinkState.READY:
            return self.failed(refusal or closed_before_ready(
                self._opened, self._exchange is not None, reason))
        self._close(refusal)
        if refusal is not None:
            return Decision(refuse_turns=refusal)
        return Decision(lose_turns=(
            f"the connection to the hub broke during the turn ({type(broken).__name__}): the "
            "stream was corrupted" if broken is not None else
            "the hub closed the connection during the turn", EndReason.NONE))

    def failed(self, error: HiveMindChatError) -> Decision:
        """Something on our side or the network's ended the link (a connect failure, a
        handshake that cannot go on, a frame that cannot be sent)."""
        if self.state is LinkState.CLOSED:
            return Decision()
        ready = self.state is LinkState.READY
        self._close(error)
        if ready:
            return Decision(lose_turns=(str(error), EndReason.NONE), close=True)
        return Decision(failed=self.error, close=True)

    def session_reset(self, reason: str) -> Decision:
        """MQTT: the hub's session of this access key ended under us without a close (its
        idle eviction, a restart, another satellite on the key), so the frames we sent since
        went unread (core/mqtt_link.py). Before READY it is a failed handshake."""
        if self.state is LinkState.CLOSED:
            return Decision()
        if self.state is not LinkState.READY:
            return self.failed(HubSessionDroppedError(f"{reason}; check the hub's log"))
        self._close(None)
        return Decision(lose_turns=(reason, EndReason.NONE), close=True, unsent=True)

    def untrusted(self, opened: Opened, max_frame_bytes: int) -> Decision:
        """A frame we must not read past (tampered, too large): the stream can no longer be
        trusted. The reason is returned in `lose_turns` (or `failed`) for the log."""
        reason, error = untrusted_frame(opened, max_frame_bytes)
        if self.state is not LinkState.READY:
            return self.failed(error)
        self._close(None)
        return Decision(lose_turns=(reason, EndReason.read(opened.verdict.value)), close=True)

    def close(self) -> Decision:
        """We close it (the pool, shutdown): turns still open end as lost."""
        if self.state is LinkState.CLOSED:
            return Decision()
        self._close(None)
        return Decision(lose_turns=("the connection was closed", EndReason.NONE), close=True)

    def unshare(self) -> None:
        """A reply came back under a per-client namespace (a 4.13-4.14 hub): the hub does not
        restore our ids, so this connection carries one session from now on."""
        self.many_sessions = False

    # ---- what the socket layer asks ----
    @property
    def ready(self) -> bool:
        return self.state is LinkState.READY

    @property
    def is_closed(self) -> bool:
        return self.state is LinkState.CLOSED

    @property
    def was_opened(self) -> bool:
        """The socket opened at some point (a failure after that is not a connect failure)."""
        return self._opened

    @property
    def exchange_started(self) -> bool:
        return self._exchange is not None

    def claim(self, hello_session: Dict[str, Any]) -> HiveMessage:
        """A spare (ready, no HELLO yet) becomes this session's connection: its HELLO."""
        if self.hello_session is not None:
            raise RuntimeError("this connection already belongs to a session")
        self.hello_session = hello_session
        return self.hello()

    def hello(self) -> HiveMessage:
        hello = self.hello_session or {}
        if self.many_sessions:      # the hub merges each message's Session over this one:
            hello = {k: v for k, v in hello.items() if k in ("session_id", "site_id")}
        # no conversation of one session may fill another's gaps
        return HiveMessage(HiveMessageType.HELLO, {"session": hello, "site_id": self._site_id})

    # ---- inside ----
    def _handshake(self, payload: Any) -> Decision:
        """The hub's offer picks the exchange (handshake.choose); its answers step it."""
        if not isinstance(payload, dict) or self.state is not LinkState.HANDSHAKING:
            return Decision()
        try:
            if self._exchange is None:
                if "envelope" in payload or "msg" in (payload.get("noise") or {}):
                    return Decision()          # an answer to a handshake we never started
                self._exchange = choose(self._hello or {}, payload, self._inputs)
                return Decision(send=[self._exchange.first()])
            send, channel = self._exchange.receive(payload)
        except HiveMindChatError as e:
            return self.failed(e)
        except Exception as e:   # our side: an unwritable key dir, a corrupt key file …
            key_dir = getattr(self._inputs.noise_keys, "directory", "noise_key_dir")
            return self.failed(HiveMindChatError(
                f"could not take part in the hub's handshake ({type(e).__name__}: {e}); for "
                f"the Noise handshake, check that noise_key_dir ({key_dir}) is a writable "
                "directory of this user's"))
        if channel is None:
            return Decision(send=list(send))
        self.generation = self._exchange.generation
        self.many_sessions = channel.many_sessions
        self.state = LinkState.READY
        # a spare says HELLO when it is claimed
        hello = [self.hello()] if self.hello_session is not None else []
        return Decision(send=list(send), channel=channel, then_send=hello)

    def _close(self, error: Optional[HiveMindChatError]) -> None:
        if self.error is None:
            self.error = error
        self.state = LinkState.CLOSED
