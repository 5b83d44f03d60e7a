"""Real hivemind-core hubs for the tests: a separate process each, on 127.0.0.1, with clients
registered through hivemind-core's own `add-client` CLI."""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from hivemind_chat_agent.bridges.local_hub import HubCredentials, hub_environment, write_server_config

HERE = os.path.dirname(os.path.abspath(__file__))
HUB_CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-core")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubProcess:
    """A hivemind-core hub in its own process on 127.0.0.1.

    Without `agent_protocol`: tests/hub_process.py, hivemind-core with the OVOS-like test
    pipeline (tests/pipeline_agent.py). With it: the real `hivemind-core listen` command, its
    server.json's "agent_protocol" set to that dict (plugins loaded by name, as in production).
    """

    def __init__(self, agent_protocol=None, server_config=None):
        self.home = tempfile.mkdtemp(prefix="hm-test-hub-")
        self.port = free_port()
        self.proc = None
        self.listen = agent_protocol is not None or server_config is not None
        path = write_server_config(self.home, agent_protocol, port=self.port)
        if server_config is not None:   # a whole server.json, e.g. an example from config/
            server_config = json.loads(json.dumps(server_config))
            server_config["network_protocol"]["hivemind-websocket-plugin"].update(
                host="127.0.0.1", port=self.port)
            with open(path, "w") as f:
                json.dump(server_config, f)

    @property
    def env(self):
        return {**os.environ, **hub_environment(self.home), "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH"))
                                              if p)}

    def start(self) -> "HubProcess":
        self.log_path = os.path.join(self.home, "hub.log")
        self._log = open(self.log_path, "a")
        if self.listen:
            cmd = [HUB_CLI, "listen"]
        else:
            cmd = [sys.executable, os.path.join(HERE, "hub_process.py"), self.home,
                   str(self.port)]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        # the hub logs to stdout: keep draining it or it blocks on a full pipe
        threading.Thread(target=self._drain, args=(self.proc.stdout, self._log),
                         daemon=True).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        with open(self.log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"test hub did not start (exit code {self.proc.poll()}):\n{tail}")

    def add_client(self, name=None, key=None, password=None) -> HubCredentials:
        """Register a client with hivemind-core's own CLI, as an operator would."""
        name = name or f"test-{secrets.token_hex(3)}"
        key = key or secrets.token_hex(16)
        password = password or secrets.token_hex(16)
        subprocess.run([HUB_CLI, "add-client", "--name", name, "--access-key", key,
                        "--password", password], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        return HubCredentials("127.0.0.1", self.port, key, password, name)

    def client_id(self, key: str) -> str:
        """The node id hivemind-core's database gave the client with this access key."""
        path = os.path.join(hub_environment(self.home)["XDG_DATA_HOME"], "hivemind-core",
                            "clients.json")
        with open(path) as f:
            clients = json.load(f)
        rows = clients.values() if isinstance(clients, dict) else clients
        return str(next(c["client_id"] for c in rows if c.get("api_key") == key))

    @staticmethod
    def _drain(stream, log):
        try:
            for line in stream:
                log.write(line)
        except (ValueError, OSError):
            pass

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


    def cleanup(self):
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
