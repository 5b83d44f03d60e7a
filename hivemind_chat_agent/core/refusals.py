"""What a hub's refusal means and what the person must do, without I/O.

Two kinds: a close frame with a reason (hivemind-core 5.x says why it refuses: 1008 "invalid
api key", "client Noise static key contradicts the pinned key", "this node requires the v3
Noise handshake"), and `hive.policy.denied`, the answer of a 4.3+ hub to a message type the
client was not allowed (it carries no session and no turn tag: it answers the last message of
that type on this connection). Which utterance topic to send lives here too, because a denial
of one is the reason to try the other; and the words for a connection the hub closed, or one
we closed on an untrustworthy frame, before or during the handshake.
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from hivemind_chat_agent.core.frames import Opened, Verdict
from hivemind_chat_agent.core.protocol_names import CURRENT_UTTERANCE_TYPE, UTTERANCE_TYPE
from hivemind_chat_agent.errors import (
    AccessKeyRejectedError,
    ClientKeyRefusedError,
    HandshakeTimeoutError,
    HiveMindChatError,
    HubEngineError,
    HubUnreachableError,
    PolicyDeniedError,
    ReplyTooLargeError,
    UnsupportedHubError,
)

# Every ovos-core understands the legacy name; 5.x hubs may admit a client on either.
UTTERANCE_TOPICS = (UTTERANCE_TYPE, CURRENT_UTTERANCE_TYPE)
BACKEND_UNAVAILABLE = "backend_unavailable"
ACL_DENIED = "acl_disallowed_type"          # the client may not send this type at all
NODE_ID_HINT = "NODE_ID (this client's id in `hivemind-core list-clients`)"


def refusal_from_close(code: Any, reason: str) -> Optional[HiveMindChatError]:
    """The typed error a hub's close frame stands for, or None for an ordinary close."""
    text = (reason or "").lower()
    if code != 1008 and not text:
        return None
    if "pinned key" in text:
        return ClientKeyRefusedError(
            "the hub refused this client's Noise key: it pinned another key for this access key "
            "(the client was reinstalled, or the key is in use on another machine). If that is "
            f"expected, the hub's operator runs `hivemind-core reset-noise-pin {NODE_ID_HINT}`")
    if "v3 noise" in text or "requires the v3" in text:
        return UnsupportedHubError(
            "the hub requires HiveMind protocol v3 (the Noise handshake) and refused the "
            "password handshake; install hivemind-bus-client>=1.2.12a1 and "
            "poorman-handshake>=2.0.0a1")
    if "api key" in text or "access key" in text or "authorization" in text:
        return AccessKeyRejectedError(
            "the hub does not know this access key; check the key or register it with "
            "`hivemind-core add-client`")
    return None


def refusal_after_noise_handshake(reason: str) -> HiveMindChatError:
    return ClientKeyRefusedError(
        f"the hub closed the connection right after the Noise handshake (1008 "
        f"\"{(reason or '')[:100]}\"): it has pinned another Noise key for this access key (the "
        "client was reinstalled, its key directory `noise_key_dir` changed, or the key is in "
        "use on another machine). If that is expected, the hub's operator runs "
        f"`hivemind-core reset-noise-pin {NODE_ID_HINT}`; the hub's log names the client")


class UtteranceTopic:
    """Which topic carries this client's utterances on one hub: a forced one, or the legacy name
    first (every ovos-core reads it) and the current one if the hub denies the legacy one."""

    def __init__(self, forced: Optional[str] = None):
        self.forced = forced
        self.current = forced or UTTERANCE_TOPICS[0]
        self._denied: List[str] = []

    @property
    def tried(self) -> List[str]:
        return list(self._denied)

    @property
    def to_allow(self) -> List[str]:
        """What the operator may allow: the forced topic, else either name."""
        return [self.forced] if self.forced else list(UTTERANCE_TOPICS)

    def denied(self, topic: str, allowed: Any = None) -> Optional[str]:
        """The hub's ACL refused `topic`: the one to send instead, or None when there is none.
        `allowed`, when the hub says what this client may send, decides."""
        if topic not in self._denied:
            self._denied.append(topic)
        if self.forced:
            return None
        if isinstance(allowed, list):
            options = [t for t in UTTERANCE_TOPICS if t in allowed and t != topic]
        else:
            options = [t for t in UTTERANCE_TOPICS if t not in self._denied]
        if not options:
            return None
        self.current = options[0]
        return self.current


def read_denial(data: Any) -> Tuple[Optional[str], str, str, Dict[str, Any]]:
    """(denied_type, code, reason, data) of a `hive.policy.denied`, tolerating junk."""
    if not isinstance(data, dict):
        return None, "", "", {}
    inner = data.get("data")
    denied = data.get("denied_type")
    return (denied if isinstance(denied, str) else None, str(data.get("code") or ""),
            str(data.get("reason") or "")[:300], inner if isinstance(inner, dict) else {})


@dataclass(frozen=True)
class DenialPlan:
    refuse: Optional[HiveMindChatError] = None   # fail the waiting turns with it
    retry: Optional[str] = None                  # send them again under this type
    note: str = ""                               # else: log this and leave them be
    loud: bool = False                           # the note is a warning


def plan_denial(denied: str, code: str, reason: str, extra: Dict[str, Any], waiting: int,
                topic: UtteranceTopic) -> DenialPlan:
    """`hive.policy.denied` carries no session or turn tag and answers one message of its type:
    `waiting` counts the turns of that type that got nothing back, the only candidates. An ACL
    denial (the client may not send the type at all) covers them all: they go again under the
    other utterance name where the hub allows it (nothing reached its agent, so nothing runs
    twice), else fail naming the operator's command. Any other denial (a quota, a policy error)
    answers one message: a single candidate fails with it; several cannot be told apart and
    are left to their timeout."""
    if not waiting:
        return DenialPlan(note=f"the hub denied a {denied} ({code}): {reason}")
    if code != ACL_DENIED:
        if waiting == 1:
            return DenialPlan(refuse=denial_error(denied, code, reason, topic.to_allow))
        return DenialPlan(note=f"the hub denied one of {waiting} {denied} in flight ({code}: "
                               f"{reason}); it does not say which, so they run to their "
                               "timeout", loud=True)
    retry = topic.denied(denied, extra.get("allowed"))
    if retry is None:
        return DenialPlan(refuse=denial_error(denied, code, reason, topic.to_allow))
    return DenialPlan(retry=retry, note=f"the hub does not allow {denied} for this client; "
                                        f"sending {retry}")


def denial_error(topic: str, code: str, reason: str, to_allow: List[str]) -> HiveMindChatError:
    """The error for an utterance the hub would not take, naming the operator's command."""
    if code == BACKEND_UNAVAILABLE:
        return HubEngineError(f"the hub admitted the utterance but could not deliver it: its "
                              f"agent bus is unreachable ({reason}); check the hub's OVOS side")
    if code != ACL_DENIED:   # a quota, a content rule, a policy error: this message only
        return PolicyDeniedError(f"the hub's policy refused this utterance ({code or 'denied'}"
                                 f"{': ' + reason if reason else ''}); try again later, or ask "
                                 "the hub's operator about its policy plugins")
    topics = " ".join(to_allow or [topic])
    return PolicyDeniedError(
        f"the hub's message policy does not allow this client to send {topic} "
        f"({code or 'denied'}); the hub's operator runs "
        f"`hivemind-core allow-msg {topics} {NODE_ID_HINT}`")


def no_handshake_in_time(opened: bool, where: str, timeout: float) -> HiveMindChatError:
    """connect_timeout passed: with the socket open (a handshake that never finished) or not."""
    if opened:
        return HandshakeTimeoutError(
            f"the hub at {where} accepted the connection but did not finish the handshake "
            f"within {timeout:g} s; check that it is a HiveMind hub and that it is not "
            "overloaded")
    return HubUnreachableError(
        f"no HiveMind hub answered at {where} within {timeout:g} s; check host and port and "
        "that hivemind-core is running")


def closed_before_ready(opened: bool, handshake_started: bool, said: str) -> HiveMindChatError:
    """The hub closed the socket before the handshake finished, naming no refusal."""
    if opened and not handshake_started:
        return AccessKeyRejectedError(
            "the hub closed the connection before the handshake: it does not know this access "
            "key; check the key or register it with `hivemind-core add-client`")
    return HubUnreachableError(
        "the hub closed the connection during the handshake; check the hub's log"
        + (f" (it said: {said[:200]})" if said else ""))


def untrusted_frame(opened: Opened, limit: int) -> Tuple[str, HiveMindChatError]:
    """Why a frame we will not read past closes the connection, and the error a connect
    in progress raises for it."""
    if opened.verdict is Verdict.TOO_LARGE:
        reason = (f"the hub sent {opened.why}, over max_frame_bytes={limit}; the connection "
                  "was closed without reading it. Raise max_frame_bytes if the hub's answers "
                  "are really that long")
        return reason, ReplyTooLargeError(reason)
    reason = (f"a frame from the hub {opened.why.replace('frame ', '', 1)}: someone tampered "
              "with the connection (or the hub is broken), so it was closed and nothing more "
              "from it was read; use wss:// on untrusted networks")
    return reason, HubUnreachableError(reason)
