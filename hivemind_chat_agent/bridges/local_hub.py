"""A genuine hivemind-core hub on 127.0.0.1, started inside this process.

Used by `hivemind-chat demo` (no hub at hand) and by the tests. It is the real thing:
hivemind-core's `HiveMindListenerProtocol` and client database behind its tornado websocket
handler, with an agent protocol of the caller's choice. Only what `HiveMindService.run`
hard-wires is replaced: the socket is bound to loopback on a free port, the IO loop runs in a
thread that can be stopped, and each hub gets its own handler class and client table so several
hubs can share a process.

hivemind-core reads its config and client database from the XDG folders on every connection,
so while a LocalHub runs, this process's XDG_CONFIG_HOME / XDG_DATA_HOME point into its `home`
(absolute: hivemind-core 5.x silently falls back to the home directory on a relative one).

Both generations run here: hivemind-core 4.0 (password handshake) and 5.x (Noise; message types
denied unless the client was allowed them, which `add_client` does for what our client sends).
"""
import asyncio
import importlib.metadata
import json
import os
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ovos_utils.log import LOG

from hivemind_chat_agent import background
from hivemind_chat_agent.core.protocol_names import (
    AUDIO_OUTPUT_END_TYPE,
    CURRENT_UTTERANCE_TYPE,
    UTTERANCE_TYPE,
)

XDG_DIRS = {"XDG_CONFIG_HOME": "config", "XDG_DATA_HOME": "data",
            "XDG_CACHE_HOME": "cache", "XDG_STATE_HOME": "state"}

# What HiveMindChatAgent sends: an utterance under either name (5.x calls ovos.utterance.handle
# current, recognizer_loop:utterance legacy) and the end of each spoken sentence, which skills
# that speak with wait=True wait for. hivemind-core 5.x denies every type a client was not
# allowed; 4.0 always allows recognizer_loop:utterance and ignores types it does not know.
CLIENT_TOPICS = (UTTERANCE_TYPE, CURRENT_UTTERANCE_TYPE, AUDIO_OUTPUT_END_TYPE)


@dataclass(frozen=True)
class HubCredentials:
    host: str
    port: int
    key: str = field(repr=False)
    password: str = field(repr=False)
    name: str = ""

    def agent_config(self, **extra) -> dict:
        """Config for `HiveMindChatAgent` talking to this hub as this client."""
        return {"host": self.host, "port": self.port, "key": self.key,
                "password": self.password, **extra}


def hub_environment(home: str) -> Dict[str, str]:
    """XDG variables that make hivemind-core (hub or CLI) use `home` for config and data."""
    home = os.path.abspath(home)
    return {var: os.path.join(home, sub) for var, sub in XDG_DIRS.items()}


def default_database() -> str:
    """The client database each generation ships as its default: SQLite from 5.x (its rows are
    read live, so `hivemind-core reset-noise-pin` or `allow-msg` take effect on a running hub;
    the JSON plugin's in-memory copy is only re-read on an unknown key), JSON on 4.x."""
    try:
        major = int(importlib.metadata.version("hivemind-core").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 0
    return "hivemind-sqlite-db-plugin" if major >= 5 else "hivemind-json-db-plugin"


def write_server_config(home: str, agent_protocol: Optional[dict] = None, port: int = 0,
                        database: Optional[str] = None) -> str:
    """hivemind-core's server.json for a loopback hub; returns its path."""
    database = database or default_database()
    path = os.path.join(hub_environment(home)["XDG_CONFIG_HOME"], "hivemind-core", "server.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    config = {
        "binarize": False,
        "allowed_encodings": ["JSON-B64", "JSON-URLSAFE-B64", "JSON-B91", "JSON-Z85B",
                              "JSON-Z85P", "JSON-B32", "JSON-HEX"],
        "allowed_ciphers": ["AES-GCM", "CHACHA20-POLY1305"],
        "agent_protocol": agent_protocol or {"module": "in-process"},
        "binary_protocol": {"module": None},
        "network_protocol": {"hivemind-websocket-plugin": {"host": "127.0.0.1", "port": port}},
        "database": {"module": database,
                     database: {"name": "clients", "subfolder": "hivemind-core"}},
    }
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return path


IDENTITY_FILE = "_identity.json"


def _identity_files(folder: str) -> Optional[List[str]]:
    """The names of a sound node identity's files in `folder` (the identity file and the
    private key it names beside it), or None if there is none or it is not whole."""
    try:
        with open(os.path.join(folder, IDENTITY_FILE)) as f:
            identity = json.load(f)
    except (OSError, ValueError):
        return None
    secret = identity.get("secret_key") if isinstance(identity, dict) else None
    if (not isinstance(secret, str) or os.path.basename(secret) != secret
            or not identity.get("public_key")):
        return None
    try:
        with open(os.path.join(folder, secret), "rb") as f:
            if b"-----END" not in f.read():       # a PEM cut short
                return None
    except OSError:
        return None
    return [IDENTITY_FILE, secret]


def restore_identity(kept: str, identity_home: str) -> bool:
    """Copy the node identity kept in `kept` into hivemind-core's identity folder
    `identity_home`; False (nothing copied) if there is none or it is not whole."""
    names = _identity_files(kept)
    if names is None:
        return False
    os.makedirs(identity_home, mode=0o700, exist_ok=True)
    for name in names:
        shutil.copyfile(os.path.join(kept, name), os.path.join(identity_home, name))
        os.chmod(os.path.join(identity_home, name), 0o600)
    return True


def keep_identity(identity_home: str, kept: str) -> None:
    """Keep the node identity of `identity_home` in `kept` for the next start, whole or not
    at all: its files go to a new folder beside `kept` that is then renamed to it (a process
    starting meanwhile finds the old folder, or this one complete). One that finds `kept`
    already there leaves it (a hub started at the same moment kept its own). A folder that
    cannot be written costs the next start a new identity, nothing else."""
    names = _identity_files(identity_home)
    if names is None:
        return
    parent = os.path.dirname(os.path.abspath(kept))
    try:
        os.makedirs(parent, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=parent, prefix=".hub-identity-")
    except OSError as e:
        LOG.warning(f"the hub's identity was not kept in {kept}: {type(e).__name__}: {e}")
        return
    try:
        for name in names:
            shutil.copyfile(os.path.join(identity_home, name), os.path.join(scratch, name))
            os.chmod(os.path.join(scratch, name), 0o600)
        if _identity_files(kept) is not None:
            return
        shutil.rmtree(kept, ignore_errors=True)     # not whole: make way for this one
        os.rename(scratch, kept)
    except OSError as e:
        if _identity_files(kept) is None:
            LOG.warning(f"the hub's identity was not kept in {kept}: {type(e).__name__}: {e}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class LocalHub:
    """`with LocalHub(agent_protocol) as hub: creds = hub.add_client()`."""

    def __init__(self, agent_protocol, home: Optional[str] = None, port: int = 0,
                 identity_dir: Optional[str] = None):
        """`identity_dir`: a folder the hub's node identity (its RSA key pair, 0.6-1.8 s to
        make) is kept in between starts: copied into a `home` that has none, made and kept
        there on the first start. None: a `home` without an identity gets a new one."""
        self.agent_protocol = agent_protocol
        self.identity_dir = identity_dir
        self._own_home = home is None
        self.home = os.path.abspath(home or tempfile.mkdtemp(prefix="hivemind-chat-hub-"))
        self.host = "127.0.0.1"
        self.port = port
        self.protocol: Any = None
        self.db: Any = None
        self._loop: Any = None
        self._server: Any = None
        self._handlers: List = []
        self._thread: Optional[threading.Thread] = None
        self._saved_env: Dict[str, Optional[str]] = {}

    # ---- lifecycle ----
    def start(self) -> "LocalHub":
        from hivemind_bus_client.identity import NodeIdentity
        from hivemind_core.database import ClientDatabase
        from hivemind_core.protocol import HiveMindListenerProtocol
        from tornado.netutil import bind_sockets

        env = hub_environment(self.home)
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        for path in env.values():
            os.makedirs(path, exist_ok=True)
        server_json = os.path.join(env["XDG_CONFIG_HOME"], "hivemind-core", "server.json")
        if not os.path.isfile(server_json):
            write_server_config(self.home)
        self.db = ClientDatabase()
        identity_home = os.path.join(env["XDG_CONFIG_HOME"], "hivemind")
        if self.identity_dir is not None and _identity_files(identity_home) is None:
            restore_identity(self.identity_dir, identity_home)
        identity = NodeIdentity()
        if not identity.public_key:
            # as `hivemind-core listen` does on 5.x: its node id is this key, and a Noise
            # handshake fails (1011) without one
            identity.create_keys()
            identity.save()
            if self.identity_dir is not None:
                keep_identity(identity_home, self.identity_dir)
        self.protocol = HiveMindListenerProtocol(agent_protocol=self.agent_protocol,
                                                 identity=identity, db=self.db)
        self.protocol.clients = {}   # the class attribute is shared by every hub in a process
        sockets = bind_sockets(self.port, self.host)
        self.port = sockets[0].getsockname()[1]
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(sockets, ready),
                                        daemon=True, name=f"hivemind-hub-{self.port}")
        background.start(self._thread)
        ready.wait(10)
        LOG.info(f"local hivemind-core hub listening on ws://{self.host}:{self.port}")
        return self

    def _serve(self, sockets, ready: threading.Event):
        from hivemind_websocket_protocol import HiveMindTornadoWebSocket
        from tornado.httpserver import HTTPServer
        from tornado.ioloop import IOLoop
        from tornado.web import Application

        asyncio.set_event_loop(asyncio.new_event_loop())
        loop = IOLoop.current()
        handlers = self._handlers

        class Handler(HiveMindTornadoWebSocket):
            def open(self):
                handlers.append(self)
                self.set_nodelay(True)   # replies are small frames; don't let Nagle hold them
                super().open()

            def on_close(self):
                if self in handlers:
                    handlers.remove(self)
                if getattr(self, "client", None) is not None:
                    super().on_close()

        Handler.hm_protocol = self.protocol
        Handler.loop = loop
        self._loop = loop
        self._server = HTTPServer(Application([("/", Handler)]))
        self._server.add_sockets(sockets)
        ready.set()
        loop.start()
        loop.close(all_fds=True)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            def shutdown():
                self._server.stop()
                for handler in list(self._handlers):
                    handler.close()
                loop.call_later(0.05, loop.stop)
            loop.add_callback(shutdown)
            thread.join(timeout=5)
        self._loop = self._thread = None
        stop_protocol = getattr(self.protocol, "shutdown", None)   # 5.x: its worker pools
        if callable(stop_protocol):
            try:
                stop_protocol()
            except Exception as e:
                LOG.warning(f"hivemind-core did not shut down cleanly: {type(e).__name__}: {e}")
        for var, value in self._saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        self._saved_env = {}
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> "LocalHub":
        return self.start()

    def __exit__(self, *_exc):
        self.stop()

    # ---- clients ----
    def add_client(self, name: str = "hivemind-chat", key: Optional[str] = None,
                   password: Optional[str] = None, admin: bool = False,
                   allow: Sequence[str] = CLIENT_TOPICS) -> HubCredentials:
        """Register a client through hivemind-core's own database API, allowed to send the
        message types in `allow` (by default what our client sends)."""
        key = key or secrets.token_hex(16)
        password = password or secrets.token_hex(16)
        with self.db as db:
            if not db.add_client(name, key, password=password, admin=admin,
                                 allowed_types=list(allow)):
                raise RuntimeError(f"hivemind-core refused to add client {name!r}")
        return HubCredentials(self.host, self.port, key, password, name)
