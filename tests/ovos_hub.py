"""A genuine OVOS hub on 127.0.0.1 for the tests: the specification our fakes only imitate.

Three processes from one virtualenv of their own (tests/requirements-ovos-hub.txt), as an OVOS
install with HiveMind has them: `ovos-messagebus`, `ovos-core` with real skills (hello-world
speaks with wait=True, alerts asks with get_response, parrot converses, the unknown fallback),
and `hivemind-core listen` with the stock hivemind-ovos-agent-plugin. They share one XDG home,
so hivemind-core and ovos-core read the same mycroft.conf, as on a real hub.

The venv is built once and cached under ~/.cache (keyed by the requirements file's hash);
`python tests/ovos_hub.py` builds it ahead of the tests (.ci/run does) and prints its path.

    python tests/ovos_hub.py --run      starts a hub and prints how to reach it (Ctrl-C stops)
"""
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REQUIREMENTS = os.path.join(HERE, "requirements-ovos-hub.txt")
# short on purpose: an abandoned question ends after two windows (ask, re-ask) instead of 40 s
RESPONSE_WINDOW = 6
HUB_PIPELINE = ["stop_high", "converse", "padatious_high", "adapt_high", "fallback_high",
                "stop_medium", "padatious_medium", "adapt_medium", "adapt_low",
                "fallback_medium", "fallback_low"]


def venv_path() -> str:
    override = os.environ.get("HIVEMIND_CHAT_OVOS_VENV")
    if override:
        return override
    with open(REQUIREMENTS, "rb") as f:
        digest = hashlib.sha256(f.read() + sys.version.encode()).hexdigest()[:12]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "hivemind-chat-agent", "venvs", f"ovos-hub-{digest}")


def ensure_venv(log=sys.stderr) -> str:
    """The OVOS hub's venv, built from the pinned requirements if it is not cached yet."""
    path = venv_path()
    marker = os.path.join(path, ".complete")
    if os.path.exists(marker):
        return path
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    started = time.monotonic()
    print(f"building the OVOS hub venv at {path} …", file=log, flush=True)
    subprocess.run([sys.executable, "-m", "venv", path], check=True)
    pip = [os.path.join(path, "bin", "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]
    subprocess.run(pip + ["--upgrade", "pip", "wheel"], check=True)
    subprocess.run(pip + ["-r", REQUIREMENTS], check=True)
    with open(marker, "w") as f:
        f.write(str(time.time()))
    print(f"OVOS hub venv ready in {time.monotonic() - started:.0f} s", file=log, flush=True)
    return path


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OVOSHub:
    """`hub = OVOSHub().start(); creds = hub.add_client(); ... hub.cleanup()`."""

    def __init__(self):
        self.venv = ensure_venv()
        self.home = tempfile.mkdtemp(prefix="hm-test-ovos-")
        self.bus_port = free_port()
        self.port = free_port()
        self.procs = {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "XDG_CONFIG_HOME": os.path.join(self.home, "config"),
                    "XDG_DATA_HOME": os.path.join(self.home, "data"),
                    "XDG_CACHE_HOME": os.path.join(self.home, "cache"),
                    "XDG_STATE_HOME": os.path.join(self.home, "state")}
        self.env.pop("PYTHONPATH", None)
        self._write_config()

    def _bin(self, name: str) -> str:
        return os.path.join(self.venv, "bin", name)

    def log_path(self, name: str) -> str:
        return os.path.join(self.home, f"{name}.log")

    def _write_config(self):
        mycroft = os.path.join(self.env["XDG_CONFIG_HOME"], "mycroft", "mycroft.conf")
        os.makedirs(os.path.dirname(mycroft), exist_ok=True)
        with open(mycroft, "w") as f:
            json.dump({
                "websocket": {"host": "127.0.0.1", "port": self.bus_port, "route": "/core",
                              "ssl": False, "shared_connection": True, "max_msg_size": 25},
                "lang": "en-US", "log_level": "INFO",
                "logs": {"path": os.path.join(self.home, "logs")},
                "skills": {"get_response_timeout": RESPONSE_WINDOW},
                # the hub's own pipeline, naming only matchers this hub has; a client that
                # sends its own (its machine's defaults) makes ovos-core log "Unknown
                # pipeline matcher" and match in the client's order
                "intents": {"pipeline": HUB_PIPELINE},
            }, f)
        server = os.path.join(self.env["XDG_CONFIG_HOME"], "hivemind-core", "server.json")
        os.makedirs(os.path.dirname(server), exist_ok=True)
        with open(server, "w") as f:
            json.dump({
                "agent_protocol": {"module": "hivemind-ovos-agent-plugin",
                                   "hivemind-ovos-agent-plugin": {"host": "127.0.0.1",
                                                                  "port": self.bus_port}},
                "binary_protocol": {"module": None},
                "network_protocol": {"hivemind-websocket-plugin": {"host": "127.0.0.1",
                                                                   "port": self.port}},
                "database": {"module": "hivemind-json-db-plugin",
                             "hivemind-json-db-plugin": {"name": "clients",
                                                         "subfolder": "hivemind-core"}},
            }, f)

    def _spawn(self, name: str, cmd):
        log = open(self.log_path(name), "a")
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=self.home, start_new_session=True)
        self.procs[name] = (proc, log)
        return proc

    def _wait(self, name: str, ready, timeout: float):
        proc, _ = self.procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if ready():
                return
            time.sleep(0.1)
        tail = self.log_tail(name, 4000)
        self.cleanup()
        raise RuntimeError(f"OVOS hub: {name} not ready (exit code {proc.poll()}):\n{tail}")

    def _listening(self, port: int):
        import socket

        def check():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False
        return check

    def start(self) -> "OVOSHub":
        self._spawn("messagebus", [self._bin("ovos-messagebus")])
        self._wait("messagebus", self._listening(self.bus_port), 60)
        self._spawn("core", [self._bin("ovos-core")])
        # first start trains padatious; later starts load the trained intents
        self._wait("core", lambda: "ovos-core is ready" in self.log_tail("core", 10 ** 7), 300)
        self._spawn("hivemind", [self._bin("hivemind-core"), "listen"])
        self._wait("hivemind", self._listening(self.port), 60)
        return self

    def add_client(self, name=None):
        """Register a client with hivemind-core's own CLI, as an operator would."""
        from hivemind_chat_agent.bridges.local_hub import HubCredentials
        name = name or f"test-{secrets.token_hex(3)}"
        key, password = secrets.token_hex(16), secrets.token_hex(16)
        subprocess.run([self._bin("hivemind-core"), "add-client", "--name", name,
                        "--access-key", key, "--password", password], env=self.env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120)
        return HubCredentials("127.0.0.1", self.port, key, password, name)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            with open(self.log_path(name), errors="replace") as f:
                return f.read()[-chars:]
        except OSError:
            return ""

    def core_log_since(self, offset: int) -> str:
        with open(self.log_path("core"), errors="replace") as f:
            f.seek(offset)
            return f.read()

    def core_log_size(self) -> int:
        return os.path.getsize(self.log_path("core"))

    def cleanup(self):
        for name, (proc, log) in reversed(list(self.procs.items())):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)   # ovos-core may ignore it for 15 s+
        for name, (proc, log) in self.procs.items():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            log.close()
        self.procs = {}
        shutil.rmtree(self.home, ignore_errors=True)


if __name__ == "__main__":
    if "--run" in sys.argv:
        sys.path.insert(0, os.path.dirname(HERE))
        hub = OVOSHub().start()
        creds = hub.add_client()
        print(json.dumps(creds.agent_config()), flush=True)
        print(f"logs in {hub.home}; Ctrl-C stops", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            hub.cleanup()
    else:
        print(ensure_venv())
