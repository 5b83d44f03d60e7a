"""A Redis Cluster from Debian's redis-server, for tests: `masters` primaries (and `replicas`
replicas of each) with `--cluster-enabled yes`, each on a free loopback port in a directory of
its own, joined by `redis-cli --cluster create ... --cluster-yes`, stopped by their PIDs."""
import os
import subprocess
from typing import Dict, List, Optional

import redis
import redis.cluster
from hubs import free_port
from servers import RedisServer, need, replication
from waiting import wait_until

NODE_TIMEOUT_MS = 1000    # a primary silent this long is failed over to its replica


class ClusterNodeServer(RedisServer):
    """A cluster node; its bus on a free port of its own (the default, its port + 10000, may
    be taken or beyond 65535). `tls`: (CA file, certificate, key): TLS on `tls_port` and on
    the cluster bus (a client on TLS is told the nodes' TLS ports; the plain port, kept for
    the tests' probes, tells the plain ones)."""

    def __init__(self, directory: str, tls: "Optional[tuple[str, str, str]]" = None):
        super().__init__(directory, tls=tls, extra=(
            "--cluster-enabled", "yes", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-port", str(free_port()),
            "--cluster-config-file", os.path.join(directory, "nodes.conf"),
            *(("--tls-cluster", "yes") if tls else ())))

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)


class RedisClusterSet:
    """`start()`: the nodes, the cluster made of them, and a wait until every node says
    `cluster_state:ok`; `url` is the conversation_store URL (two of the nodes: the client
    finds the rest)."""

    def __init__(self, directory: str, masters: int = 3, replicas: int = 0,
                 tls: "Optional[tuple[str, str, str]]" = None):
        """`tls`: every node on TLS too (ClusterNodeServer), and `url` the rediss+cluster://
        one trusting that CA."""
        self.replicas = replicas
        self.tls = tls
        self.nodes = [ClusterNodeServer(os.path.join(directory, f"node-{i}"), tls)
                      for i in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        if self.tls:
            return "rediss+cluster://" + ",".join(
                f"127.0.0.1:{n.tls_port}" for n in self.nodes[:2]) + f"?ssl_ca_certs={self.tls[0]}"
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def start(self) -> "RedisClusterSet":
        tls = ("--tls", "--cacert", self.tls[0]) if self.tls else ()
        try:
            for node in self.nodes:
                node.start()
            subprocess.run([need("redis-cli"), *tls, "--cluster", "create",
                            *[f"127.0.0.1:{n.tls_port or n.port}" for n in self.nodes],
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            assert wait_until(self.ok, 60), "the cluster never said cluster_state:ok"
            assert wait_until(self.replicated, 60), "the replicas never caught up"
        except BaseException:
            self.stop()
            raise
        return self

    def ok(self) -> bool:
        """Every running node says cluster_state:ok and sees every slot served."""
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client()
            try:
                info = client.execute_command("CLUSTER INFO")
                if info.get("cluster_state") != "ok" or int(info["cluster_slots_ok"]) != 16384:
                    return False
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def replicated(self) -> bool:
        """Every primary has its `replicas` online (synced: WAIT can count them)."""
        return all(len([r for r in replication(node.port)[0] if r.get("state") == "online"])
                   >= self.replicas for node in self.primaries())

    def in_sync(self) -> bool:
        """Every primary's replicas have all it has written (their offsets at its own): what
        was answered so far survives a primary's failover."""
        for node in self.primaries():
            replicas, written = replication(node.port)
            if len(replicas) < self.replicas or \
                    min((r.get("offset", -1) for r in replicas), default=0) < written:
                return False
        return True

    def node_of(self, key: str) -> int:
        """The port of the primary serving `key`'s slot now."""
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client()
            try:
                slot = client.execute_command("CLUSTER KEYSLOT", key)
                for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        return int(primary[1])
            finally:
                client.close()
        raise RuntimeError("no node answered")

    def kill_primary_of(self, key: str) -> int:
        """kill -9 of the primary serving `key`'s slot; its port."""
        port = self.node_of(key)
        [node] = [n for n in self.nodes if n.port == port]
        node.kill()
        return port

    def errors(self) -> Dict[int, Dict[str, dict]]:
        """Each running node's INFO errorstats ({port: {"errorstat_CROSSSLOT": {"count": n}}}):
        what it refused since it started."""
        out = {}
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client()
            try:
                out[node.port] = dict(client.info("errorstats"))
            finally:
                client.close()
        return out

    def primaries(self) -> List[ClusterNodeServer]:
        """The running nodes that are primaries now."""
        out = []
        for node in self.nodes:
            if node.process is None:
                continue
            client = node.client()
            try:
                if client.info("replication")["role"] == "master":
                    out.append(node)
            finally:
                client.close()
        return out

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SharedRedis:
    """The Redis a store test runs on, one Redis or a cluster, as the test sees it: its `url`,
    `keys(pattern)` (every node's, named without their hash tag, so that one assertion holds
    for both layouts) and `raw` (a redis-py client for the test's own reads and writes)."""

    def __init__(self, url: str, cluster: "RedisClusterSet | None" = None):
        self.url = url
        self.cluster = cluster
        if cluster is None:
            self.raw = redis.Redis.from_url(url, decode_responses=True)
        else:
            self.raw = redis.cluster.RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode("127.0.0.1", n.port)
                               for n in cluster.nodes[:2]], decode_responses=True)

    def key(self, session_id: str, name: str) -> str:
        """The key `name` ("history:<session id>", ...) of `session_id`'s calls as stored."""
        from hivemind_chat_agent.hub.redis_keys import prefixer
        return prefixer(self.cluster is not None)(session_id) + name

    def stored(self) -> List[str]:
        """Every `hivemind-chat:` key as stored, of every primary (redis-py's KEYS on a
        cluster asks one node)."""
        if self.cluster is None:
            return self.raw.keys("hivemind-chat:*")
        found = []
        for node in self.cluster.primaries():
            client = node.client()
            try:
                found += client.keys("hivemind-chat:*")
            finally:
                client.close()
        return found

    def keys(self, pattern: str) -> List[str]:
        """Keys matching `hivemind-chat:<pattern>` once their `{tag}:` is taken out, sorted."""
        import fnmatch
        import re
        plain = [re.sub(r"^hivemind-chat:\{[^}]*\}:", "hivemind-chat:", k)
                 for k in self.stored()]
        return sorted(k for k in plain if fnmatch.fnmatchcase(k, f"hivemind-chat:{pattern}"))

    def flush(self) -> None:
        """Every node empty (a cluster shared by the tests of a run starts each one empty)."""
        for node in self.cluster.primaries() if self.cluster else []:
            client = node.client()
            try:
                client.flushall()
            finally:
                client.close()

    def close(self) -> None:
        self.raw.close()
