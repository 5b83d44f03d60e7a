"""The replica deployment of docs/scale-out.md, for tests and benchmarks: a real redis-server,
genuine hivemind-core 5.x hubs from config/server-replica.json sharing it, a real haproxy from
config/haproxy.cfg in front, the hub identity cloned from the first replica, and one client
registered on every replica."""
import json
import os
import shutil
from typing import List, Optional

from hubs import HubProcess, free_port
from servers import HAProxy, RedisServer

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config")


def replica(store_url: str, **knobs) -> HubProcess:
    """A replica from config/server-replica.json on `store_url`, its health endpoint on a free
    loopback port (`health_port`, what haproxy checks)."""
    with open(os.path.join(CONFIG, "server-replica.json")) as f:
        config = json.load(f)
    health_port = free_port()
    config["agent_protocol"]["hivemind-chat-agent-plugin"].update(
        conversation_store=store_url, health=f"127.0.0.1:{health_port}", **knobs)
    hub = HubProcess(server_config=config, generation="5")
    hub.health_port = health_port
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
    handshake, so call it after one turn), starts another replica and registers the client."""

    def __init__(self, directory: str, replicas: int = 2, hub=None, **knobs):
        """`hub(store_url)` makes each replica (default: config/server-replica.json with
        `knobs` in the plugin's config)."""
        self.redis = RedisServer(os.path.join(directory, "redis"))
        make = hub or (lambda url: replica(url, **knobs))
        self.hubs: List[HubProcess] = [make(self.redis.url) for _ in range(replicas)]
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
