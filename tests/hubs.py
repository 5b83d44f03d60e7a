"""Real hivemind-core hubs for the tests: a separate process each, on 127.0.0.1, with clients
registered through hivemind-core's own `add-client` CLI."""
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

from hivemind_chat_agent.local_hub import HubCredentials, hub_environment, write_server_config

HERE = os.path.dirname(os.path.abspath(__file__))
HUB_CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-core")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubProcess:
    """A hivemind-core hub with the test pipeline (tests/pipeline_agent.py) in its own process."""

    def __init__(self, script: str = "hub_process.py", args=()):
        self.home = tempfile.mkdtemp(prefix="hm-test-hub-")
        self.script = os.path.join(HERE, script)
        self.args = list(args)
        self.port = free_port()
        self.proc = None
        write_server_config(self.home)

    @property
    def env(self):
        return {**os.environ, **hub_environment(self.home), "PYTHONUNBUFFERED": "1"}

    def start(self) -> "HubProcess":
        self.log_path = os.path.join(self.home, "hub.log")
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, self.script, self.home, str(self.port), *self.args],
            env=self.env, stdout=subprocess.PIPE, stderr=self._log, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("READY"):
                # the hub logs to stdout too: keep draining it or it blocks on a full pipe
                threading.Thread(target=self._drain, args=(self.proc.stdout, self._log),
                                 daemon=True).start()
                return self
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"test hub did not start (exit code {self.proc.poll()})")

    def add_client(self, name=None, key=None, password=None) -> HubCredentials:
        """Register a client with hivemind-core's own CLI, as an operator would."""
        name = name or f"test-{secrets.token_hex(3)}"
        key = key or secrets.token_hex(16)
        password = password or secrets.token_hex(16)
        subprocess.run([HUB_CLI, "add-client", "--name", name, "--access-key", key,
                        "--password", password], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        return HubCredentials("127.0.0.1", self.port, key, password, name)

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
