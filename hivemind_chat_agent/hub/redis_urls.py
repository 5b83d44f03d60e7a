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

With TLS (the rediss forms) the server's certificate is verified against the system's CAs
unless the query names others, in redis-py's words, the same on every form:
`?ssl_ca_certs=/etc/redis/ca.crt` (the CA file), `ssl_certfile` and `ssl_keyfile` (this hub's
own certificate, for a Redis with `tls-auth-clients yes`; `ssl_password` the key's passphrase,
never shown), `ssl_cert_reqs` (required, the default; optional; none) and `ssl_check_hostname`
(true, the default; false). They go to every connection: the data nodes', sentinels' and
cluster nodes'. A file that is not there, a TLS option on a URL without TLS, an `ssl_` option
not known here (any option on the Sentinel and Cluster forms) is a ConfigurationError when
the hub starts, not a store that fails every turn.

On a cluster the client is redis-py's RedisCluster: it reads the slot map from the first node
that answers and sends each key's commands to the primary serving its slot. Everything one
round trip or script of the store touches is in one slot (hub/redis_store.py's hash tags), so
it never needs more than one node. A cluster has no databases: a path is refused.
"""
import os
import threading
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import redis
import redis.cluster
import redis.sentinel

from hivemind_chat_agent.errors import ConfigurationError

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix") + SENTINEL_SCHEMES + CLUSTER_SCHEMES
TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
TLS_CHOICES = {"ssl_cert_reqs": ("required", "optional", "none"),
               "ssl_check_hostname": ("true", "false")}
TLS_SECRETS = ("ssl_password",)        # the key file's passphrase: never shown
TLS_KEYS = TLS_FILES + tuple(TLS_CHOICES) + TLS_SECRETS


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
        if scheme != "unix":      # checked here; redis-py reads the query itself
            tls_options(url, parse_qs(urlsplit(url).query), others=None)
        return redis.Redis.from_url(url, **options)
    where = parse_sentinel_url(url)
    options.update(where["tls"])
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
    options.update(where["tls"])
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
    if not nodes or parts.path.strip("/"):
        raise ConfigurationError(
            f"conversation_store: {shown_url(url)} must be redis+cluster://[USER:PASSWORD@]"
            "HOST:PORT[,HOST:PORT...]: some of the cluster's nodes, no database (a cluster "
            "has only database 0)")
    return {"nodes": nodes, "username": unquote(username) or None,
            "password": unquote(password) or None,
            "tls": tls_options(url, parse_qs(parts.query))}


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
            "sentinel_password": next(iter(query.get("sentinel_password", [])), None),
            "tls": tls_options(url, query, others=("sentinel_password",))}


def tls_options(url: str, query: Dict[str, List[str]],
                others: Optional[Tuple[str, ...]] = ()) -> Dict[str, Any]:
    """The connection options of a URL's TLS: `{"ssl": True, ...}` with the query's TLS
    settings for a rediss form, `{}` without TLS, each read as redis-py reads a query (the
    first of a repeated key, as written). ConfigurationError for a file that is not there, a
    value not among the choices, a TLS setting without TLS, or a query key that is neither a
    TLS setting nor one of `others`. `others` None: the redis:// and rediss:// forms, whose
    query redis-py's from_url reads itself; then only an `ssl_` key must be known here (a
    misspelt one would fail every connection, not the start)."""
    tls = urlsplit(url).scheme.startswith("rediss")
    unknown = [k for k in query if k not in TLS_KEYS + (others or ())
               and (others is not None or k.startswith("ssl_"))]
    if unknown:
        raise ConfigurationError(
            f"conversation_store: {shown_url(url)} has options not known here: "
            f"{', '.join(unknown)}; it takes {', '.join(TLS_KEYS)}"
            + "".join(f" and {name}" for name in others or ()))
    given = {k: v[0] for k, v in query.items() if k in TLS_KEYS}
    if given and not tls:
        raise ConfigurationError(
            f"conversation_store: {shown_url(url)} has TLS settings but no TLS: write rediss "
            "for redis in the scheme (rediss://, rediss+sentinel://, rediss+cluster://)")
    for name, value in given.items():
        if name in TLS_FILES and not (os.path.isfile(value) and os.access(value, os.R_OK)):
            raise ConfigurationError(
                f"conversation_store: {name}={value} is not a file this hub can read")
        if name in TLS_CHOICES and value not in TLS_CHOICES[name]:
            raise ConfigurationError(
                f"conversation_store: {name} is one of {', '.join(TLS_CHOICES[name])}, "
                f"not {value!r}")
    options: Dict[str, Any] = {k: v for k, v in given.items() if k != "ssl_check_hostname"}
    if "ssl_check_hostname" in given:
        options["ssl_check_hostname"] = given["ssl_check_hostname"] == "true"
    return {"ssl": True, **options} if tls else {}


def shown_url(url: str) -> str:
    """The URL as it may be logged: no password, nor the value of any query key that names
    one (sentinel_password, ssl_password, or any other)."""
    parts = urlsplit(url)
    credentials, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in credentials:
        credentials = credentials.partition(":")[0] + ":***"
    query = "&".join((pair.partition("=")[0] + "=***" if "password" in
                      pair.partition("=")[0].lower() else pair)
                     for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit(parts._replace(netloc=credentials + at + hosts, query=query))
