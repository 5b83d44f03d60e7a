"""The replica deployment of docs/scale-out.md, for tests and benchmarks: a real redis-server,
genuine hivemind-core 5.x hubs from config/server-replica-shared-db.json sharing it (the
conversations in its db 0, hivemind-core's clients in db 1 through hivemind-redis-database), a
real haproxy from config/haproxy.cfg in front, the hub identity cloned from the first replica,
and one client registered once, with the first replica's own CLI."""
import json
import os
import shutil
from typing import Any, List, Optional

from hubs import HubProcess, free_port
from servers import HAProxy, RedisServer

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")


def replica(store_url: str, clients: Optional[Any] = None, **knobs) -> HubProcess:
    """A replica on `store_url`, its health endpoint on a free loopback port (`health_port`,
    what haproxy checks). `clients`: the Redis (anything with the `port` it serves on, on
    127.0.0.1: a RedisServer, or haproxy in front of a Sentinel's primary) whose db 1 holds
    the client database every replica shares (config/server-replica-shared-db.json, run from
    the cached venv redis-db-hub-5); None: a sqlite client database of its own
    (config/server-replica.json), for a lone hub or to show what separate databases do.
    `shared_clients` says which."""
    name = "server-replica-shared-db.json" if clients else "server-replica.json"
    with open(os.path.join(CONFIG, name)) as f:
        config = json.load(f)
    health_port = free_port()
    config["agent_protocol"]["hivemind-chat-agent-plugin"].update(
        conversation_store=store_url, health=f"127.0.0.1:{health_port}", **knobs)
    if clients:
        config["database"]["hivemind-redis-db-plugin"].update(host="127.0.0.1",
                                                              port=clients.port)
    hub = HubProcess(server_config=config, generation="5",
                     venv="redis-db-hub-5" if clients else None)
    hub.health_port = health_port
    hub.shared_clients = clients is not None
    return hub


def clone_identity(source: HubProcess, target: HubProcess) -> None:
    """Copy the hub identity (`$XDG_CONFIG_HOME/hivemind/`: RSA key, Noise key, _identity.json)
    as an operator copies it to another machine; paths inside point at the new home."""
    src = os.path.join(source.home, "config", "hivemind")
    dst = os.path.join(target.home, "config", "hivemind")
    shutil.copytree(src, dst, dirs_exist_ok=True)
    path = os.path.join(dst, "_identity.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace(source.home, target.home))


class ReplicaSet:
    """`start()` runs Redis, haproxy and the first replica and registers the client there;
    `add_replica()` clones the identity (the first replica's Noise key exists after its first
    handshake, so call it after one turn) and starts another replica, which knows the client
    from the shared database (a replica with a database of its own gets it registered too)."""

    def __init__(self, directory: str, replicas: int = 2, hub=None, **knobs):
        """`hub(store_url, clients)` makes each replica (default: `replica` with the shared
        client database in this set's Redis and `knobs` in the plugin's config)."""
        self.redis = RedisServer(os.path.join(directory, "redis"))
        make = hub or (lambda url, clients: replica(url, clients, **knobs))
        self.hubs: List[HubProcess] = [make(self.redis.url, self.redis)
                                       for _ in range(replicas)]
        checks = [getattr(h, "health_port", None) for h in self.hubs]
        self.proxy = HAProxy(os.path.join(directory, "haproxy"),
                             os.path.join(CONFIG, "haproxy.cfg"), [h.port for h in self.hubs],
                             checks if all(checks) else None)
        self.key = self.password = ""
        self.running: List[HubProcess] = []

    def start(self) -> "ReplicaSet":
        self.redis.start()
        self.proxy.start()
        first = self.hubs[0].start()
        creds = first.add_client(name="replicated")
        self.key, self.password = creds.key, creds.password
        self.running.append(first)
        self.wait_up(first)
        return self

    def agent_config(self, **extra) -> dict:
        return {"host": "127.0.0.1", "port": self.proxy.port, "key": self.key,
                "password": self.password, **extra}

    def add_replica(self) -> HubProcess:
        hub = self.hubs[len(self.running)]
        clone_identity(self.hubs[0], hub)
        hub.start()
        if not getattr(hub, "shared_clients", False):
            hub.add_client(name="replicated", key=self.key, password=self.password)
        self.running.append(hub)
        self.wait_up(hub)
        return hub

    def restart(self, hub: HubProcess) -> None:
        hub.start()
        self.wait_up(hub)

    def name(self, hub: HubProcess) -> str:
        return f"hub{self.hubs.index(hub) + 1}"

    def wait_up(self, hub: HubProcess) -> None:
        name = self.name(hub)
        if not self.proxy.wait_until(lambda s: s[name]["status"] == "UP"):
            raise RuntimeError(f"haproxy never counted {name} up: {self.proxy.servers()}")

    def holder(self) -> Optional[HubProcess]:
        """The replica haproxy has a connection open to (None: none)."""
        servers = self.proxy.servers()
        return next((h for h in self.hubs if servers[self.name(h)]["sessions"]), None)

    def wait_no_sessions(self, hub: HubProcess) -> bool:
        return self.proxy.wait_until(lambda s: s[self.name(hub)]["sessions"] == 0)

    def stop(self) -> None:
        self.proxy.stop()
        for hub in self.hubs:
            hub.cleanup()
        self.redis.stop()
