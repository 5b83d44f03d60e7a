"""The conversation store a plugin's config names (hub/conversation_store.py has the contract)."""
from typing import Callable
from urllib.parse import urlsplit

from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.hub.conversation_store import (
    MAX_TURN_RECORDS_PER_CLIENT,
    ConversationStore,
    MemoryStore,
)

# hub/redis_urls.SCHEMES, named here so that a "memory" hub never imports redis
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel",
                 "redis+cluster", "rediss+cluster")


def open_store(url: str, history_turns: int, history_bytes: int, session_ttl: float,
               data_home: Callable[[], str], max_sessions_per_client: int = 256,
               max_turn_records_per_client: int = MAX_TURN_RECORDS_PER_CLIENT,
               durable: bool = False) -> ConversationStore:
    """The store `url` names ("memory", or "redis://..." / "rediss://..." / "unix://...", or
    "redis+sentinel://..." for the primary Redis Sentinel names, or "redis+cluster://..." for a
Redis Cluster: hub/redis_urls.py). `durable` (store_durable): Redis writes that keep a turn's
outcome wait for a replica (hub/redis_store.py); ConfigurationError on the memory store, which
has no replica to wait for.
    The memory store leaves `max_sessions_per_client` to the plugin's SatelliteSessions (it
    is the only hub); Redis holds it for all the replicas sharing it."""
    scheme = urlsplit(url).scheme if "://" in url else url
    if scheme in ("", "memory"):
        if durable:
            raise ConfigurationError(
                'store_durable: true needs a Redis conversation_store with a replica to wait '
                'for ("redis+sentinel://..." or "redis+cluster://..."); the memory store has '
                "none")
        return MemoryStore(history_turns, history_bytes, data_home,
                           max_turn_records_per_client=max_turn_records_per_client)
    if scheme in REDIS_SCHEMES:
        from hivemind_chat_agent.extras import require
        require("redis", "the Redis conversation store")
        from hivemind_chat_agent.hub.redis_store import RedisStore
        return RedisStore(url, history_turns, history_bytes, session_ttl,
                          max_sessions_per_client=max_sessions_per_client,
                          max_turn_records_per_client=max_turn_records_per_client,
                          durable=durable)
    raise ConfigurationError(
        f'conversation_store must be "memory" or a redis:// URL (redis://HOST:PORT/DB, '
        f"redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB], redis+cluster://HOST:PORT"
        f"[,HOST:PORT...]), not {scheme!r}")
