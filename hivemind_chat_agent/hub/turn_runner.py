"""Worker thread: one satellite turn run by the hub plugin's engine (hub/protocol.py queues it).

The turn begins in the store (its record claimed, its Session and history read: this must be
done before the engine runs, or a resent turn could run twice, hub/turn_records.py; when a free
worker takes the turn at once, the IO loop has written that round trip already and the worker
reads its replies: `send_begin`), runs the engine in the satellite's Session with that history,
keeps the Session if the engine changed it, and never leaves behind a session whose satellite
went meanwhile.
"""
from typing import Any, Dict, Protocol

from ovos_bus_client.session import Session, SessionManager
from ovos_utils.log import LOG

from hivemind_chat_agent.compat import register_session as register
from hivemind_chat_agent.core.clock import Clock
from hivemind_chat_agent.core.conversation import conversation_for_turn
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub.asides import Asides
from hivemind_chat_agent.hub.connections import connection_closed
from hivemind_chat_agent.hub.conversation_store import ConversationStore, TurnRecordsFull
from hivemind_chat_agent.hub.hub_turn import HubTurn, agent_messages
from hivemind_chat_agent.hub.satellite_book import SatelliteBook
from hivemind_chat_agent.hub.settings import HubSettings
from hivemind_chat_agent.hub.turn_records import run_here


class RunnerHost(Protocol):
    """What running a turn needs of the plugin (hub/protocol.ChatAgentProtocol)."""
    engine: Any
    settings: HubSettings
    clock: Clock
    store: ConversationStore
    asides: Asides
    satellites: SatelliteBook


def run_turn(host: RunnerHost, turn: HubTurn) -> None:
    """Worker thread: the turn's job in the plugin's executor. Its end reaches the satellite
    whatever happens (`HubTurn.finish`); a store that does not answer ends it with
    STORE_UNAVAILABLE, a client out of room for turn records with BUSY."""
    if turn.finished or connection_closed(turn.client):  # timed out, stopped, or left
        if turn.sent_begin is not None:
            _give_up_begin(host.store, turn)
        turn.abandon()         # (nothing if it had ended)
        return
    turn.deadline = host.clock.now() + host.settings.timeout
    try:
        begun = host.store.begin(turn.session_id, turn.turn_id, client=turn.store_client,
                                 sent=turn.sent_begin)
        if not run_here(host.store, turn, begun.record, host.clock.sleep):
            return     # answered from the turn's record (hub/turn_records.py)
    except (ConversationStoreError, TurnRecordsFull) as e:
        turn.finish(failed=True, why=str(e), reason=EndReason.BUSY if isinstance(
            e, TurnRecordsFull) else EndReason.STORE_UNAVAILABLE)
        host.satellites.forget_if_untracked(turn.session_id)
        return
    turn.earlier, kept = begun.history, begun.session
    sess = Session.deserialize(conversation_for_turn(turn.satellite_session,
                                                     turn.session_id, kept))
    register(sess)
    began = sess.serialize()
    try:
        host.asides.follow(turn)
        turn.converse(host.engine, sess, agent_messages(begun.history, turn.utterance))
        _keep_session(host.store, turn.session_id, began, turn.store_client)
    finally:
        host.satellites.forget_if_untracked(turn.session_id)


def _give_up_begin(store: ConversationStore, turn: HubTurn) -> None:
    """A turn that ended while queued, or whose satellite left, after its begin went out to
    the store: the replies read (the connection is reused) and the record it claimed given up,
    as if it had never begun: a resend runs it, here or on another replica."""
    try:
        begun = store.begin(turn.session_id, turn.turn_id, client=turn.store_client,
                            sent=turn.sent_begin)
        if turn.turn_id and begun.record is None:
            store.unclaim(turn.session_id, turn.turn_id, client=turn.store_client)
    except (ConversationStoreError, TurnRecordsFull) as e:
        LOG.warning(f"a turn that did not run left its record in the store: {e}")


def _keep_session(store: ConversationStore, session_id: str, began: Dict[str, Any],
                  client: str) -> None:
    """The Session as the engine left it, written only when it changed."""
    sess = SessionManager.sessions.get(session_id)
    now = sess.serialize() if sess is not None else began
    if now == began:
        return
    try:
        store.keep_session(session_id, now, client=client)
    except ConversationStoreError as e:   # answered already; the next turn may fail
        LOG.warning(f"the session after a turn was not kept: {e}")
