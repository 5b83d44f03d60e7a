"""The one way the hub plugin writes an ended exchange to its conversation store, whether a
satellite's turn (hub/hub_turn.py) or a client's QUERY (hub/query.py) ended.

In a store of this hub alone the exchange joins its session's history only while the plugin
still follows that session: a turn that outlived its satellite (a disconnect, the TTL, the
per-client cap) must not bring the session back. A shared store (replicas on one Redis) keeps
it whatever this hub follows: a satellite whose connection was cut mid-turn (by HAProxy, the
replica alive) continues on another replica at once, and the exchange this hub ran, which the
other answers from its record, belongs to that conversation's history; the shared store bounds
sessions by its own TTL and per-client cap. A turn this hub owns the record of
(hub/turn_records.py) has that record done with it whatever became of the session, so a
resent turn is answered from it.
"""
from dataclasses import dataclass
from typing import Callable, List

from ovos_utils.log import LOG

from hivemind_chat_agent.core.transcript import Exchange
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub.conversation_store import ConversationStore


@dataclass(frozen=True)
class EndedExchange:
    """An exchange as it ended, for the store."""
    session_id: str              # the engine session it belongs to
    utterance: str
    sentences: List[str]         # what was said, in order
    ended: str                   # ANSWERED, STOPPED, or the EndReason's value of a failure
    earlier: List[Exchange]      # the history its answer began with
    turn_id: str = ""            # the record this hub owns and finishes with it ("" for none)
    client: str = ""             # whose bounds the store counts it against


def keep_exchange(store: ConversationStore, followed: Callable[[str], bool],
                  ended: EndedExchange, strict: bool = False) -> None:
    """Write `ended`: its exchange into the history if the store is shared or
    `followed(session_id)`, its record done if it has one. A store that does not answer is a
    WARNING: the asker has its answer already, and only the history (or the record) lacks
    it; `strict` (store_durable, the asker not yet told): it raises ConversationStoreError."""
    keep = store.shared or followed(ended.session_id)
    if not (keep or ended.turn_id):
        return
    try:
        store.finish(ended.session_id, ended.turn_id,
                     Exchange(ended.utterance, "\n".join(ended.sentences), ended.ended),
                     ended.sentences, ended.earlier, keep_exchange=keep, client=ended.client)
    except ConversationStoreError as e:
        if strict:
            raise
        kept = "exchange and record" if ended.turn_id else "exchange"
        LOG.warning(f"the {kept} of an ended turn could not be kept: {e}")
