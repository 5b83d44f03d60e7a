"""The conversation store a plugin's config names (hub/conversation_store.py has the contract)."""
from typing import Callable
from urllib.parse import urlsplit

from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.hub.conversation_store import ConversationStore, MemoryStore


def open_store(url: str, history_turns: int, history_bytes: int, session_ttl: float,
               data_home: Callable[[], str]) -> ConversationStore:
    """The store `url` names ("memory", or "redis://..." / "rediss://..." / "unix://...")."""
    scheme = urlsplit(url).scheme if "://" in url else url
    if scheme in ("", "memory"):
        return MemoryStore(history_turns, history_bytes, data_home)
    if scheme in ("redis", "rediss", "unix"):
        from hivemind_chat_agent.extras import require
        require("redis", "the Redis conversation store")
        from hivemind_chat_agent.hub.redis_store import RedisStore
        return RedisStore(url, history_turns, history_bytes, session_ttl)
    raise ConfigurationError(
        f'conversation_store must be "memory" or a redis:// URL (redis://HOST:PORT/DB), '
        f"not {scheme!r}")
