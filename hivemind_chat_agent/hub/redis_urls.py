"""The Redis a `conversation_store` URL names, as a redis-py client, and that URL as it may be
logged.

    redis://[USER:PASSWORD@]HOST:PORT/DB       one Redis (rediss:// with TLS, unix:// a socket)
    redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]
                                              the primary that Redis Sentinel names SERVICE
                                              (rediss+sentinel:// with TLS)

Behind Sentinel the client asks the sentinels for SERVICE's primary whenever it opens a
connection, so after a failover the next turn goes to the promoted replica by itself. A
connection still open to the old primary fails (redis-py turns the demoted primary's
READONLY into a connection error and drops it): that turn ends `store_unavailable`, like any
other moment the store is unreachable, and the next one reconnects. The credentials are the
data nodes'; sentinels that want a password of their own take `?sentinel_password=...`.
"""
from typing import Any, Dict, List, Tuple
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import redis
import redis.sentinel

from hivemind_chat_agent.errors import ConfigurationError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = ("redis", "rediss", "unix") + SENTINEL_SCHEMES


def redis_client(url: str, **options: Any) -> redis.Redis:
    """A client for the Redis `url` names; `options` (timeouts, decoding) go to every
    connection it opens, sentinels' too."""
    scheme = urlsplit(url).scheme
    if scheme not in SENTINEL_SCHEMES:
        return redis.Redis.from_url(url, **options)
    where = parse_sentinel_url(url)
    if scheme == "rediss+sentinel":
        options["ssl"] = True
    sentinel_options = {k: v for k, v in options.items() if k != "decode_responses"}
    if where["sentinel_password"]:
        sentinel_options["password"] = where["sentinel_password"]
    sentinel = redis.sentinel.Sentinel(where["sentinels"], sentinel_kwargs=sentinel_options,
                                       **options)
    return sentinel.master_for(where["service"], db=where["db"],
                               username=where["username"], password=where["password"])


def parse_sentinel_url(url: str) -> Dict[str, Any]:
    """The parts of a redis+sentinel:// URL; ConfigurationError naming what is wrong."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    sentinels: List[Tuple[str, int]] = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ConfigurationError(
                f"conversation_store: {host!r} in {shown_url(url)} is not HOST:PORT; a "
                "Sentinel URL names its sentinels as redis+sentinel://HOST:PORT,HOST:PORT/"
                "SERVICE")
        sentinels.append((name.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(
            f"conversation_store: {shown_url(url)} must be redis+sentinel://HOST:PORT[,HOST:"
            "PORT...]/SERVICE[/DB]: the sentinels, then the service name they watch")
    query = parse_qs(parts.query)
    return {"sentinels": sentinels, "service": unquote(path[0]),
            "db": int(path[1]) if len(path) == 2 else 0,
            "username": unquote(username) or None, "password": unquote(password) or None,
            "sentinel_password": next(iter(query.get("sentinel_password", [])), None)}


def shown_url(url: str) -> str:
    """The URL as it may be logged: no password (nor a sentinel password)."""
    parts = urlsplit(url)
    credentials, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in credentials:
        credentials = credentials.partition(":")[0] + ":***"
    query = "&".join(("sentinel_password=***" if pair.startswith("sentinel_password=")
                      else pair) for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit(parts._replace(netloc=credentials + at + hosts, query=query))
