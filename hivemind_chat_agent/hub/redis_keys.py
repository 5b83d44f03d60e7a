"""The Redis store's key names (hub/redis_store.py), and the hash tags that keep a turn on one
Redis Cluster node.

Every key starts with `hivemind-chat:`. On one Redis (redis://, redis+sentinel://) the names are
the ones this plugin always used:

    hivemind-chat:history:<session>          hivemind-chat:sessions:<client>
    hivemind-chat:session:<session>          hivemind-chat:turns:<client>
    hivemind-chat:turn:<n>:<session>:<turn>  hivemind-chat:alive:<hub>
    hivemind-chat:secret

On a cluster (redis+cluster://) every key a turn touches carries its conversation's hash tag,
so that each round trip and each script of the store (hub/redis_scripts.py) stays within one
slot, hence one node, and no command ever gets CROSSSLOT:

    hivemind-chat:{<tag>}:history:<session>    and so on for session, turn, sessions, turns

The tag is the client: an engine session id is `sat-<client fingerprint>-<declared id>`
(core/satellites.engine_session_id), and the tag is that fingerprint. The per-client indexes
(`sessions:`, `turns:`) must share a slot with every session of the client, because the caps'
scripts read an index and delete the sessions' keys it names in one atomic step; a per-session
tag would put them on different nodes. So one client's conversations all live on one node, and
clients spread over the nodes (a front that serves many users through one access key puts them
all on one node). An id that is not an engine session id (no `sat-<client>-` head) is its own
tag. Every key of one store call is named from the session id's tag, the index keys too
(`hivemind-chat:{<tag>}:sessions:<client>`): a caller naming a client that is not the session
id's head would split that client's index per tag, never make a call cross slots.

`secret` and `alive:<hub>` are read and written alone (one key per command), so they need no
tag and keep their names on a cluster, where each lives on whichever node its slot is.

A deployment moving from one Redis to a cluster starts the cluster empty: conversations begin
afresh and the first hub writes a new secret (a one-time loss of the conversations' memory, as
docs/scale-out.md says). One Redis or Sentinel keeps its existing keys as they are.
"""
from typing import Callable

from hivemind_chat_agent.hub.conversation_store import KEY_PREFIX

SECRET = KEY_PREFIX + "secret"


def conversation_tag(session_id: str) -> str:
    """The client fingerprint of an engine session id `sat-<client>-<declared>`; any other id
    is its own tag."""
    if session_id.startswith("sat-"):
        client, dash, _ = session_id[4:].partition("-")
        if dash and client:
            return client
    return session_id


def prefixer(cluster: bool) -> Callable[[str], str]:
    """session id -> the prefix of every key of its calls: `hivemind-chat:` on one Redis,
    `hivemind-chat:{<tag>}:` on a cluster (the scripts get it as their ARGV[1] and name every
    key they make with it, so they stay in the slot of their KEYS)."""
    if not cluster:
        return lambda session_id: KEY_PREFIX
    return lambda session_id: f"{KEY_PREFIX}{{{conversation_tag(session_id)}}}:"


def member(session_id: str, turn_id: str) -> str:
    """A turn record's name: the session id's length in bytes first, so that no two
    (session, turn id) pairs share one whatever ':' they contain."""
    return f"{len(session_id.encode('utf-8'))}:{session_id}:{turn_id}"


def session_key(prefix: str, session_id: str) -> str:
    return f"{prefix}session:{session_id}"


def history_key(prefix: str, session_id: str) -> str:
    return f"{prefix}history:{session_id}"


def turn_key(prefix: str, session_id: str, turn_id: str) -> str:
    return f"{prefix}turn:{member(session_id, turn_id)}"


def sessions_key(prefix: str, client: str) -> str:
    return f"{prefix}sessions:{client}"


def turns_key(prefix: str, client: str) -> str:
    return f"{prefix}turns:{client}"


def alive_key(owner: str) -> str:
    return f"{KEY_PREFIX}alive:{owner}"
