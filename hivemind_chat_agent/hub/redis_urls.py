"""The Redis a `conversation_store` URL names, as a redis-py client, and that URL as it may be
logged.

    redis://[USER:PASSWORD@]HOST:PORT/DB       one Redis (rediss:// with TLS, unix:// a socket)
    redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]
                                              the primary that Redis Sentinel names SERVICE
                                              (rediss+sentinel:// with TLS)
    redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]
                                              a Redis Cluster, found from any of these nodes
                                              (rediss+cluster:// with TLS); database 0 only

Behind Sentinel the client asks the sentinels for SERVICE's primary whenever it opens a
connection, so after a failover the next turn goes to the promoted replica by itself. A
connection still open to the old primary fails (redis-py turns the demoted primary's
READONLY into a connection error and drops it): that turn ends `store_unavailable`, like any
other moment the store is unreachable, and the next one reconnects. The credentials are the
data nodes'; sentinels that want a password of their own take `?sentinel_password=...`.

On a cluster the client is redis-py's RedisCluster: it reads the slot map from the first node
that answers and sends each key's commands to the primary serving its slot. Everything one
round trip or script of the store touches is in one slot (hub/redis_store.py's hash tags), so
it never needs more than one node. A cluster has no databases: a path is refused.
"""
import threading
from typing import Any, Dict, List, Tuple
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import redis
import redis.cluster
import redis.sentinel

from hivemind_chat_agent.errors import ConfigurationError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix") + SENTINEL_SCHEMES + CLUSTER_SCHEMES


def is_cluster(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def redis_client(url: str, **options: Any) -> Any:
    """A client for the Redis `url` names (redis.Redis, or redis.cluster.RedisCluster for a
    cluster URL); `options` (timeouts, decoding) go to every connection it opens, sentinels'
    and cluster nodes' too."""
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        return cluster_client(url, **options)
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


def cluster_client(url: str, **options: Any) -> Any:
    """A RedisCluster that starts from the URL's nodes, made at its first use: the slot map
    is read then (a cluster down when the hub starts fails that turn, store_unavailable, as a
    single Redis would, not the hub's start)."""
    where = parse_cluster_url(url)
    if urlsplit(url).scheme == "rediss+cluster":
        options["ssl"] = True
    nodes = [redis.cluster.ClusterNode(host, port) for host, port in where["nodes"]]
    return _LazyCluster(dict(startup_nodes=nodes, username=where["username"],
                             password=where["password"], **options))


class _LazyCluster:
    """A RedisCluster made at its first use: RedisCluster's constructor connects to read the
    slot map, and raises when no node answers."""

    def __init__(self, options: Dict[str, Any]):
        self._options = options
        self._cluster: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if self._cluster is None:
            with self._lock:
                if self._cluster is None:
                    self._cluster = redis.cluster.RedisCluster(**self._options)
        return getattr(self._cluster, name)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()


def parse_cluster_url(url: str) -> Dict[str, Any]:
    """The parts of a redis+cluster:// URL; ConfigurationError naming what is wrong."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    nodes = _host_ports(url, hosts, "redis+cluster://HOST:PORT,HOST:PORT")
    if not nodes or parts.path.strip("/") or parts.query:
        raise ConfigurationError(
            f"conversation_store: {shown_url(url)} must be redis+cluster://[USER:PASSWORD@]"
            "HOST:PORT[,HOST:PORT...]: some of the cluster's nodes, no database (a cluster "
            "has only database 0) and no options")
    return {"nodes": nodes, "username": unquote(username) or None,
            "password": unquote(password) or None}


def _host_ports(url: str, hosts: str, form: str) -> List[Tuple[str, int]]:
    """HOST:PORT,HOST:PORT... as (host, port) pairs; ConfigurationError showing `form`."""
    pairs: List[Tuple[str, int]] = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ConfigurationError(
                f"conversation_store: {host!r} in {shown_url(url)} is not HOST:PORT; the URL "
                f"names its nodes as {form}")
        pairs.append((name.strip("[]"), int(port)))
    return pairs


def parse_sentinel_url(url: str) -> Dict[str, Any]:
    """The parts of a redis+sentinel:// URL; ConfigurationError naming what is wrong."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, _, password = credentials.partition(":")
    sentinels = _host_ports(url, hosts, "redis+sentinel://HOST:PORT,HOST:PORT/SERVICE")
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
