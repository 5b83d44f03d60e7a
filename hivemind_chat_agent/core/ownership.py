"""Which of this connection's sessions a reply belongs to, by its session id and turn tag.

A reply naming another session never reaches a turn of ours, whatever turn tag it carries
(the tag is copied from our context, so anyone who saw one utterance could reuse it). The one
exception is hivemind-core 4.13-4.14, which answers each session under a per-client namespace
(`<16 hex>:<our id>`) without restoring our id: such a reply is ours.
"""
import re
from typing import Callable, Mapping, Optional, Tuple

NAMESPACED = re.compile(r"[0-9a-f]{16}:(.+)")   # hivemind-core's per-client session namespace


def claim(session_id: str, tag: Optional[str], open_tags: Mapping[str, str],
          carries: Callable[[str], bool], namespace: Optional[str] = None
          ) -> Tuple[Optional[str], bool]:
    """(the id of our session the reply belongs to, or None; whether it came namespaced).
    `open_tags` maps the tags of turns in flight to their sessions; `carries(id)` says whether
    this connection carries that session; `namespace` is our own prefix once a reply to one of
    our turns showed it (`namespace_of`): only then is an untagged namespaced reply ours."""
    owner = open_tags.get(tag) if tag is not None else None
    match = NAMESPACED.fullmatch(session_id)
    unwrapped = match.group(1) if match else None
    if owner is not None:                          # one of our turns: only its own session
        if session_id == owner:
            return owner, False
        return (owner, True) if unwrapped == owner else (None, False)
    if carries(session_id):
        return session_id, False
    if unwrapped is not None and carries(unwrapped) and namespace_of(session_id) == namespace:
        return unwrapped, True
    return None, False


def namespace_of(session_id: str) -> Optional[str]:
    return session_id.split(":", 1)[0] if NAMESPACED.fullmatch(session_id) else None
