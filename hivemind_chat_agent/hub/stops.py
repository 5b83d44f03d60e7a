"""A satellite's stop (`mycroft.stop`, barge-in) on the hub plugin (hub/protocol.py).

As OVOS stops speech: each of that session's open turns ends now with its
`ovos.utterance.handled` and says nothing more; an engine that can stop a session's work
(`stop_session`) is told to, off the IO loop. Answered, like a skill, with
"<plugin>.stop.response" {"result": whether a turn was stopped}; a stop that cannot be applied
(a session id over core/limits.MAX_ID_BYTES, the store holding the hub secret down) is
answered {"result": false, "reason", "message"} and logged in one bounded line.
"""
import threading
from typing import Any, Dict

from ovos_bus_client.message import Message
from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.core.limits import shown, shown_name
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import ConversationStoreError, IdentifierTooLongError
from hivemind_chat_agent.hub.refusal_log import warn_refusal
from hivemind_chat_agent.hub.senders import sender_of
from hivemind_chat_agent.hub.settings import PLUGIN_NAME


def stop_turns(protocol, message: Message) -> None:
    """IO loop: apply a satellite's stop. `protocol` is the ChatAgentProtocol."""
    try:
        sender = protocol.identify(message, "a stop")
    except (ConversationStoreError, IdentifierTooLongError) as e:
        peer, sat_session = sender_of(message)
        warn_refusal("stop", peer, f"refusing a stop from {shown_name(peer)}: {e}")
        reason = EndReason.ID_TOO_LONG if isinstance(e, IdentifierTooLongError) \
            else EndReason.STORE_UNAVAILABLE
        respond(protocol, protocol.clients.get(peer), peer, message, sat_session,
                {"result": False, "reason": reason.value, "message": str(e)})
        return
    if sender is None:
        return
    client, peer, session_id = sender.client, sender.peer, sender.session_id
    stopped = [turn for turn in protocol.open_turns.of(session_id, client) if turn.stop()]
    for turn in stopped:
        protocol.unqueue(turn)        # if it never started
    stop_session = getattr(protocol.engine, "stop_session", None)
    if stopped and callable(stop_session):
        background.start(threading.Thread(target=_stop_engine, daemon=True,
                                          args=(stop_session, session_id)))
    respond(protocol, client, peer, message, sender.satellite_session,
            {"result": bool(stopped)})


def respond(protocol, client, peer: str, message: Message, sat_session: Dict[str, Any],
            data: Dict[str, Any]) -> None:
    ctx = dict(message.context)
    ctx["source"], ctx["destination"] = PLUGIN_NAME, peer
    ctx["session"] = sat_session
    protocol.send(client, peer, Message(f"{PLUGIN_NAME}.stop.response",
                                        {"skill_id": PLUGIN_NAME, **data}, ctx))


def _stop_engine(stop_session, session_id: str) -> None:
    try:
        stop_session(session_id)
    except Exception as e:   # the turn has ended anyway; the engine's bug is logged
        LOG.warning(f"the engine failed to stop a session: {type(e).__name__}: "
                    f"{shown(str(e), 200, quote=False)}")
