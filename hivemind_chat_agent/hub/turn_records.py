"""Exactly once across replicas: a turn id that reaches the hub again (our client resends a
turn whose connection was lost before its end, to whichever replica it reaches now) is answered
from the turn's record in the conversation store, never run a second time while its first run
can still finish.

    no record           this hub claims it and runs the turn, noting each sentence and the end
    done                the sentences and end are sent again; the engine does not run
    running, owner up   wait for it to end (the turn's own rolling timeout bounds the wait)
    running, owner dead take it over and run the turn again from the start (the client skips
                        the sentences it already has)

Our client sends a turn id (its turn tag) with every utterance; utterances without one
(stock satellites) keep no record. A turn id is bounded (core/limits.MAX_ID_BYTES): the plugin
refuses a longer one before anything is kept. Records are kept per client (the store's
`client`), so another client's turns never push one out (hub/turn_table.py).
"""
from typing import Any, Optional

from ovos_utils.log import LOG

from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from hivemind_chat_agent.core.transcript import ANSWERED, STOPPED
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.hub.conversation_store import DONE, ConversationStore, TurnRecord
from hivemind_chat_agent.hub.hub_turn import HubTurn

POLL = 0.1       # seconds between looks at a record another replica is running


def turn_id_of(context: Any) -> str:
    """The turn id an utterance carries ("" for none, or for one that is not a string); its
    length is for the caller to check (core/limits.over_bound)."""
    tag = context.get(TURN_TAG_KEY) if isinstance(context, dict) else None
    return tag if isinstance(tag, str) else ""


def run_here(store: ConversationStore, turn: HubTurn, record: Optional[TurnRecord],
             sleep) -> bool:
    """Worker thread: True if this hub is to run the turn (it owns its record, or the turn has
    no id); False if it was answered from the record or ended while waiting. `record` is what
    `store.begin` found (None: claimed for this hub). Raises ConversationStoreError when the
    store is down, TurnRecordsFull when the record lapsed and the client has no room for it
    again."""
    if not turn.turn_id:
        return True
    while record is not None:
        if record.state == DONE:
            replay(turn, record)
            return False
        if not record.owner_alive and store.take_over(turn.session_id, turn.turn_id):
            LOG.info("a turn whose replica died mid-answer is run again here")
            break
        if turn.finished:      # its rolling timeout passed while the other run went on
            return False
        sleep(POLL)
        record = store.turn_record(turn.session_id, turn.turn_id) or \
            store.claim_turn(turn.session_id, turn.turn_id, turn.store_client)
    turn.owns_record = True
    return True


def replay(turn: HubTurn, record: TurnRecord) -> None:
    """The turn's first run ended: the satellite gets what it said and how it ended."""
    turn.replayed = True
    for sentence in record.sentences:
        turn.speak(sentence)
    if record.ended in (ANSWERED, STOPPED):
        turn.finish(failed=False)
    else:
        turn.finish(failed=True, why=f"the turn's first run ended: {record.ended}",
                    reason=EndReason.read(record.ended))
