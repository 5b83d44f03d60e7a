"""Real hivemind-core hubs for the tests: a separate process each, on 127.0.0.1, with clients
registered through hivemind-core's own `add-client` CLI.

Two generations: "5" (the current line, from this interpreter's venv: constraints.txt) and
"4.0" (hivemind-core 4.0.0, from the cached venv tests/hub_venvs.py builds, running this
checkout's current source). On 5.x a client may send only the message types it was allowed
(deny by default since hivemind-core 4.3.0a1); `add_client` allows CLIENT_TOPICS unless told
otherwise.
"""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from hivemind_chat_agent.bridges.local_hub import (
    HubCredentials,
    hub_environment,
    write_server_config,
)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hub_venvs  # noqa: E402
from ports import free_port  # noqa: E402,F401  (the tests' servers' ports)
from spawned import record, stop  # noqa: E402
from waiting import accepting, wait_until  # noqa: E402

# the current line's CLI (generation "5"); a hub's own is HubProcess.cli
HUB_CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-core")
GENERATIONS = ("4.0", "5")

def hub_generations():
    """The hub generations the real-hub tests run against: HIVEMIND_CHAT_GENERATIONS (comma
    separated, e.g. "4.0" or "5"), all of them by default."""
    import pytest
    wanted = os.environ.get("HIVEMIND_CHAT_GENERATIONS", "")
    chosen = [g.strip() for g in wanted.split(",") if g.strip()] or list(GENERATIONS)
    unknown = [g for g in chosen if g not in GENERATIONS]
    if unknown:
        raise pytest.UsageError(f"HIVEMIND_CHAT_GENERATIONS: unknown {unknown}; "
                                f"known: {', '.join(GENERATIONS)}")
    return chosen


CURRENT_TOPIC, LEGACY_TOPIC = "ovos.utterance.handle", "recognizer_loop:utterance"
AUDIO_OUTPUT_END = "recognizer_loop:audio_output_end"
STOP = "mycroft.stop"
# what our client (and a stock satellite) sends: either utterance topic, the end of each
# spoken sentence (skills that speak with wait=True wait for it), and the stop of an answer
# (barge-in: ChatTurn.terminate)
CLIENT_TOPICS = (LEGACY_TOPIC, CURRENT_TOPIC, AUDIO_OUTPUT_END, STOP)
# what hivemind-core 4.0.0 allows a new client by default (hivemind-plugin-manager 0.5.0's
# Client); recognizer_loop:utterance cannot be taken away there, and a denied type is dropped
# without an answer
V4_DEFAULT_TOPICS = ("recognizer_loop:utterance", "recognizer_loop:record_begin",
                     "recognizer_loop:record_end", "recognizer_loop:audio_output_start",
                     "recognizer_loop:audio_output_end", "recognizer_loop:b64_transcribe",
                     "speak:b64_audio", "ovos.common_play.SEI.get.response")


def knows_key(port: int, key: str, timeout: float = 10.0) -> bool:
    """Whether the running 4.0 hub on `port` accepts access key `key` now: a websocket opened
    with it gets the hub's first handshake frame (an unknown key is closed at once). Opening
    it makes the hub read its client database from disk, so from then on it has the key.

    Why: hivemind-core 4.0 writes its whole in-memory client table to the JSON database after
    every message a satellite sends (last_seen), and reads the file again only when a
    connection opens or a bus message arrives. A client `add-client` registers while another
    satellite talks can be written over and lost: seen as `allow-msg` failing with "Invalid
    Node ID!" for a client registered while another was connected."""
    import base64

    import websocket
    auth = base64.b64encode(f"hub-probe:{key}".encode()).decode()
    try:
        ws = websocket.create_connection(f"ws://127.0.0.1:{port}/?authorization={auth}",
                                         timeout=timeout)
    except (OSError, websocket.WebSocketException):
        return False
    try:
        return bool(ws.recv())
    except (OSError, websocket.WebSocketException):
        return False
    finally:
        ws.close()


def register_client(cli, env, generation, name=None, key=None, password=None, allow=None,
                    admin=False):
    """`hivemind-core add-client` (and `allow-msg`) as an operator runs them on `generation`.

    allow=None: the client may send CLIENT_TOPICS (5.x), the hub's defaults and mycroft.stop
    (4.0). A list: on
    5.x exactly those ([] = nothing at all); on 4.0 its defaults plus those.
    Returns (HubCredentials without host/port, node id)."""
    name = name or f"test-{secrets.token_hex(3)}"
    key = key or secrets.token_hex(16)
    weak_ok = password is not None   # a test that picks the password means it
    password = password or secrets.token_hex(16)
    cmd = [*argv(cli), "add-client", "--name", name, "--access-key", key, "--password", password]
    if admin:
        cmd += ["--admin", "true"]
    if generation != "4.0":
        allow = CLIENT_TOPICS if allow is None else allow
        cmd += [arg for topic in allow for arg in ("--allow", topic)]
        if weak_ok:
            cmd.append("--allow-weak-password")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"hivemind-core add-client failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    found = re.search(r"^Node ID:\s*(\S+)", proc.stdout, re.M)
    node_id = found.group(1) if found else None
    if generation == "4.0":
        extra = [t for t in (allow or ()) if t not in V4_DEFAULT_TOPICS]
        if allow is None:
            extra = [STOP]
        if extra:
            allow_msg(cli, env, generation, node_id, *extra)
    return name, key, password, node_id



def allow_msg(cli, env, generation, node_id, *topics):
    """`hivemind-core allow-msg`: 5.x takes several types in one call, 4.0 one per call."""
    calls = [[*topics, str(node_id)]] if generation != "4.0" else \
        [[t, str(node_id)] for t in topics]
    for args in calls:
        proc = subprocess.run([*argv(cli), "allow-msg", *args], env=env, capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0 or "Invalid Node ID" in proc.stdout:
            raise RuntimeError(f"hivemind-core allow-msg {' '.join(args)} failed:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def argv(cli):
    """The command line that runs `cli`: a path, or a list (an interpreter and a script, for a
    copied venv whose scripts still name the original's interpreter)."""
    return list(cli) if isinstance(cli, (list, tuple)) else [cli]


def plugin_config(engine="engines:ScriptEngine", engine_config=None, **knobs):
    """server.json's "agent_protocol" for our plugin with `engine` (tests/engines.py's by
    default) and the plugin's settings."""
    return {"module": "hivemind-chat-agent-plugin",
            "hivemind-chat-agent-plugin": {"engine": engine,
                                           "engine_config": engine_config or {}, **knobs}}


def wait_listening(port: int, timeout: float = 30, proc=None, what: str = "a server",
                   host: str = "127.0.0.1") -> None:
    """Until something accepts connections on `host`:`port`; RuntimeError after `timeout`
    or when `proc` (a Popen) has exited."""
    def state():
        if proc is not None and proc.poll() is not None:
            return "exited"
        return "up" if accepting(port, host) else None
    if wait_until(state, timeout, poll=0.05) == "up":
        return
    raise RuntimeError(f"{what} did not listen on {port}"
                       + (f" (exit code {proc.poll()})" if proc is not None else ""))


class HubProcess:
    """A hivemind-core hub in its own process on 127.0.0.1.

    Without `agent_protocol`: tests/hub_process.py, hivemind-core with the OVOS-like test
    pipeline (tests/pipeline_agent.py). With it: the real `hivemind-core listen` command, its
    server.json's "agent_protocol" set to that dict (plugins loaded by name, as in production).
    """

    def __init__(self, agent_protocol=None, server_config=None, generation="5", venv=None,
                 installed_in=None):
        """`venv`: another hub venv of tests/hub_venvs.py to run from (e.g. "ovos-hub", whose
        hivemind-core 4.0.0 has the stock OVOS agent plugin beside it). `installed_in`: the
        folder of a venv that has this package installed, run as it is (no source on its
        path; its scripts run through its own interpreter, so a copied venv works too)."""
        if generation not in GENERATIONS:
            raise ValueError(f"generation must be one of {GENERATIONS}, not {generation!r}")
        self.generation = generation
        if installed_in is not None:
            self.venv = installed_in
            self.python = os.path.join(installed_in, "bin", "python")
            self.cli = [self.python, os.path.join(installed_in, "bin", "hivemind-core")]
            self._pythonpath = [HERE]
        elif generation == "5" and venv is None:   # the current line: this interpreter's venv
            self.python, self.cli = sys.executable, HUB_CLI
            self._pythonpath = [HERE, os.environ.get("PYTHONPATH")]
        else:   # its own venv; this checkout's source first on its path
            venv = hub_venvs.ensure_venv(venv or "hub-4.0")
            self.venv = venv
            self.python = os.path.join(venv, "bin", "python")
            self.cli = os.path.join(venv, "bin", "hivemind-core")
            self._pythonpath = [hub_venvs.package_path(), HERE]
        self.home = tempfile.mkdtemp(prefix=f"hm-test-hub{generation}-")
        self.port = free_port()
        self.proc = None
        self.node_ids = {}   # access key -> node id, of the clients add_client registered
        self.listen = agent_protocol is not None or server_config is not None
        path = write_server_config(self.home, agent_protocol, port=self.port,
                                   database="hivemind-json-db-plugin" if generation == "4.0"
                                   else "hivemind-sqlite-db-plugin")
        if server_config is not None:   # a whole server.json, e.g. an example from config/
            server_config = json.loads(json.dumps(server_config))
            server_config["network_protocol"]["hivemind-websocket-plugin"].update(
                host="127.0.0.1", port=self.port)
            with open(path, "w") as f:
                json.dump(server_config, f)

    @property
    def env(self):
        return {**os.environ, **hub_environment(self.home), "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in self._pythonpath if p)}

    def start(self) -> "HubProcess":
        self.log_path = os.path.join(self.home, "hub.log")
        self._log = open(self.log_path, "a")
        if self.listen:
            cmd = [*argv(self.cli), "listen"]
        else:
            cmd = [self.python, os.path.join(HERE, "hub_process.py"), self.home,
                   str(self.port)]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        record(self.proc, self.home)
        # the hub logs to stdout: keep draining it or it blocks on a full pipe
        threading.Thread(target=self._drain, args=(self.proc.stdout, self._log),
                         daemon=True).start()
        def state():
            if self.proc.poll() is not None:
                return "exited"
            return "up" if accepting(self.port, connect_timeout=0.5) else None
        if wait_until(state, 60, poll=0.05) == "up":
            return self
        self.kill()
        with open(self.log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"test hub ({self.generation}) did not start "
                           f"(exit code {self.proc.poll()}):\n{tail}")

    def add_client(self, name=None, key=None, password=None, allow=None,
                   admin=False) -> HubCredentials:
        """Register a client with hivemind-core's own CLI, as an operator would.

        allow=None: on 5.x the client may send CLIENT_TOPICS (both utterance topics and
        audio_output_end); pass a list for exactly those ([] for nothing). On 4.0 the hub's
        own defaults apply, plus any listed type they lack (register_client)."""
        for _ in range(4):      # a running 4.0 hub can write its stale copy over the new client
            name, key, password, node_id = register_client(
                self.cli, self.env, self.generation, name, key, password, allow, admin)
            if not self._running_v4() or knows_key(self.port, key):
                break
        if node_id is not None:
            self.node_ids[key] = node_id
        return HubCredentials("127.0.0.1", self.port, key, password, name)

    def _running_v4(self) -> bool:
        return self.generation == "4.0" and self.proc is not None and self.proc.poll() is None

    def allow_msg(self, key: str, *topics: str) -> None:
        """`hivemind-core allow-msg TOPIC... NODE_ID` for the client with this access key."""
        allow_msg(self.cli, self.env, self.generation, self.client_id(key), *topics)

    def client_id(self, key: str) -> str:
        """The node id hivemind-core's database gave the client with this access key."""
        if key in self.node_ids:
            return self.node_ids[key]
        data = os.path.join(hub_environment(self.home)["XDG_DATA_HOME"], "hivemind-core")
        if os.path.isfile(os.path.join(data, "clients.json")):   # hivemind-json-db-plugin
            with open(os.path.join(data, "clients.json")) as f:
                clients = json.load(f)
            rows = clients.values() if isinstance(clients, dict) else clients
            return str(next(c["client_id"] for c in rows if c.get("api_key") == key))
        # 5.x's default, hivemind-sqlite-db-plugin: ask the CLI rather than its schema
        out = subprocess.run([*argv(self.cli), "list-clients"], env={**self.env, "COLUMNS": "400"},
                             capture_output=True, text=True, timeout=120).stdout
        for line in out.splitlines():
            cells = [c.strip() for c in re.split(r"[│|┃]", line)]
            if key in cells:
                return next(c for c in cells if c.isdigit())
        raise KeyError("no client with that access key on this hub")

    def logs(self) -> str:
        """Everything the hub logged so far: its output, and what `listen` writes into its
        XDG state dir."""
        text = ""
        for path in (self.log_path, os.path.join(self.home, "state", "mycroft", "hivemind.log")):
            try:
                with open(path, errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
        return text

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
        if self.proc:
            stop(self.proc)


    def cleanup(self):
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
