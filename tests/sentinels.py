"""Redis Sentinel from Debian's redis-server, for tests: a primary, a replica and three
sentinels watching them, all on free loopback ports, each in a directory of its own and stopped
by its PID. The sentinels are Debian's redis-sentinel (its package's binary, run with a config
of the test's own; the package's service is not used), quick to judge: a primary silent for
1 s is down."""
import os
from typing import Optional, Tuple

import redis
from hubs import free_port
from servers import RedisServer, ServerProcess, need, replication, tls_arguments
from waiting import wait_until

SERVICE = "hub"
DOWN_AFTER_MS = 1000


class SentinelProcess(ServerProcess):
    """`tls`: (CA file, certificate, key): the sentinel serves TLS on `tls_port` too and
    watches the Redis over TLS (`primary_port` is then the primary's TLS port)."""

    def __init__(self, directory: str, primary_port: int,
                 tls: "Optional[tuple[str, str, str]]" = None):
        self.directory = directory
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        self.tls = tls
        self.primary_port = primary_port
        self.process = None

    def start(self) -> "SentinelProcess":
        os.makedirs(self.directory, exist_ok=True)
        conf = os.path.join(self.directory, "sentinel.conf")   # sentinel rewrites it
        with open(conf, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 2\n"
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {SERVICE} 10000\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n")
            if self.tls:      # the same options as redis-server's, written as a config file
                options = tls_arguments(self.tls, self.tls_port)
                f.writelines(f"{name[2:]} {value}\n"
                             for name, value in zip(options[::2], options[1::2], strict=True))
        self.spawn([need("redis-sentinel"), conf], "sentinel.log", self.answers_as_redis)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2,
                           decode_responses=True)


class SentinelSet:
    """`start()`: the primary, its replica (in sync) and three sentinels that see both and
    each other; `url` is the conversation_store URL our hubs take."""

    def __init__(self, directory: str, tls: "Optional[tuple[str, str, str]]" = None):
        """`tls`: (CA file, certificate, key): every server also on TLS, replication and the
        sentinels' watch over TLS, and `url` the rediss+sentinel:// one trusting that CA."""
        self.tls = tls
        self.primary = RedisServer(os.path.join(directory, "primary"), tls=tls)
        primary_port = self.primary.tls_port or self.primary.port
        self.replica = RedisServer(os.path.join(directory, "replica"), tls=tls,
                                   extra=("--replicaof", "127.0.0.1", str(primary_port)))
        self.sentinels = [SentinelProcess(os.path.join(directory, f"sentinel-{i}"),
                                          primary_port, tls) for i in range(3)]

    @property
    def url(self) -> str:
        if self.tls:
            hosts = ",".join(f"127.0.0.1:{s.tls_port}" for s in self.sentinels)
            return f"rediss+sentinel://{hosts}/{SERVICE}/0?ssl_ca_certs={self.tls[0]}"
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> "SentinelSet":
        """Everything started and watching, or everything stopped again and the error (a set
        half started would go on watching, and failing over, through the tests after)."""
        try:
            self.primary.start()
            self.replica.start()
            for sentinel in self.sentinels:
                sentinel.start()
            watching = wait_until(lambda: all(self._views().values()), 60, poll=0.2)
            assert watching, f"the sentinels never saw the replica and each other: {self._views()}"
        except BaseException:
            self.stop()
            raise
        return self

    def _views(self) -> "dict[int, bool]":
        """Whether each sentinel (by port) knows the replica and the two other sentinels."""
        views = {}
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                views[sentinel.port] = len(client.sentinel_slaves(SERVICE)) >= 1 and \
                    len(client.sentinel_sentinels(SERVICE)) >= 2
            finally:
                client.close()
        return views

    def primary_address(self) -> Optional[Tuple[str, int]]:
        """Where the sentinels say the primary is now (the first that answers)."""
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                host, port = client.sentinel_get_master_addr_by_name(SERVICE)
                return host, int(port)
            except (redis.RedisError, TypeError, ValueError):
                continue
            finally:
                client.close()
        return None

    def in_sync(self) -> bool:
        """The replica has everything the primary acknowledged (Redis replicates
        asynchronously: what a killed primary had not yet sent is lost in a failover)."""
        replicas, offset = replication(self.primary.port)
        return bool(replicas) and all(int(r["offset"]) >= offset for r in replicas)

    def bring_back_primary(self, replica_of: Optional[Tuple[str, int]] = None) -> None:
        """The killed primary started again on its port, empty (no persistence here): a master
        in its own eyes until the sentinels convert it, or `replica_of`'s replica from the
        start; either way with replica-priority 0. With down-after-milliseconds at 1 s the
        sentinels may think a just-promoted primary down for a moment on a loaded machine and
        fail over again: to this node, still empty, if it may be chosen, and the promoted one,
        made its replica, drops everything (seen twice in test_sentinel_durable_hub, once with
        the node back as a primary, once as a plain replica)."""
        self.primary.extra += ("--replica-priority", "0")
        if replica_of is not None:
            self.primary.extra += ("--replicaof", *map(str, replica_of))
        self.primary.start()

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary]:
            server.stop()
