"""Real servers from Debian's packages for the tests (redis-server; haproxy; mosquitto), each on
a free loopback port, in a directory of its own, stopped by its PID."""
import os
import shutil
import socket
import subprocess
from typing import Optional

from ports import free_port
from spawned import record, stop
from waiting import wait_until


def need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise RuntimeError(f"{program} is not installed: apt-get install {program} "
                           "(.ci/run installs it)")
    return path


class ServerProcess:
    """A server started from a Debian package's binary, logging into its directory, stopped by
    its PID (terminate, then kill)."""
    directory: str
    port: int
    process: Optional[subprocess.Popen] = None

    def spawn(self, argv: "list[str]", log_name: str, ready) -> None:
        """Start `argv` and wait (20 s at most) until `ready()` says it serves."""
        os.makedirs(self.directory, exist_ok=True)
        self.process = subprocess.Popen(
            argv, stdout=open(os.path.join(self.directory, log_name), "ab"),
            stderr=subprocess.STDOUT)
        record(self.process, self.directory)
        def state():
            if self.process.poll() is not None:
                return "exited"
            try:
                return "up" if ready() else None
            except OSError:
                return None
        got = wait_until(state, 20, poll=0.05)
        if got == "exited":
            raise RuntimeError(f"{argv[0]} exited ({self.process.returncode}); see "
                               f"{self.directory}/{log_name}")
        if got == "up":
            return
        self.stop()
        raise RuntimeError(f"{argv[0]} did not serve within 20 s; see "
                           f"{self.directory}/{log_name}")

    def kill(self) -> None:
        """kill -9: the server dies with whatever it had not yet handed on."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
        self.process = None

    def answers_as_redis(self) -> bool:
        """The redis-server (or sentinel) on `self.port` is the process started here: a PONG
        alone may come from another server on that port (a sentinel that could not bind its
        port once looked ready because the replica on it answered)."""
        return self.process is not None and redis_pid(self.port) == self.process.pid


def redis_pid(port: int) -> Optional[int]:
    """The process id of the redis-server (or sentinel) serving on `port`, None if none
    answers."""
    import redis
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5)
    try:
        return int(client.info("server")["process_id"])
    except (redis.RedisError, KeyError, ValueError):
        return None
    finally:
        client.close()


def replication(port: int) -> "tuple[list[dict], int]":
    """The Redis on `port`'s INFO replication: its replicas (state, offset ...) and its own
    offset (master_repl_offset)."""
    import redis
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        info = client.info("replication")
    finally:
        client.close()
    replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return replicas, int(info["master_repl_offset"])


class RedisServer(ServerProcess):
    """redis-server on 127.0.0.1, no persistence; `stop()` and `start()` again keep the port,
    as a Redis that goes down and comes back does."""

    def __init__(self, directory: str, port: Optional[int] = None,
                 extra: "tuple[str, ...]" = (), tls: "Optional[tuple[str, str, str]]" = None):
        """`extra`: more redis-server options (`("--replicaof", "127.0.0.1", "6379")`).
        `tls`: (CA file, certificate, key): TLS on `tls_port` too, replication over TLS."""
        self.directory = directory
        self.port = port or free_port()
        self.tls_port = free_port() if tls else None
        self.extra = tuple(extra) + (tls_arguments(tls, self.tls_port) if tls else ())
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.spawn([need("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", self.directory, *self.extra],
                   "redis.log", self.answers_as_redis)
        return self


def tls_arguments(tls: "tuple[str, str, str]", port: Optional[int]) -> "tuple[str, ...]":
    """redis-server's options for TLS on `port` with (CA file, certificate, key): clients'
    certificates optional, and what it opens to other Redis (replication) over TLS too. The
    plain port stays, on loopback, for the tests' own probes."""
    ca, cert, key = tls
    return ("--tls-port", str(port), "--tls-cert-file", cert, "--tls-key-file", key,
            "--tls-ca-cert-file", ca, "--tls-auth-clients", "optional",
            "--tls-replication", "yes")


class HAProxy(ServerProcess):
    """haproxy in the foreground on a free loopback port, from config/haproxy.cfg with its
    frontend and server ports replaced, plus a stats socket the tests read. `check_ports`: each
    backend's health port (the plugin's "health", checked with the template's GET
    /readyz?not_ready=404); None for backends without one (hubs answering as OVOS does): then
    a TCP connect is the check, as it was before the plugin had a health endpoint."""

    def __init__(self, directory: str, template: str, backends: "list[int]",
                 check_ports: "Optional[list[int]]" = None):
        self.directory = directory
        self.port = free_port()
        self.socket = os.path.join(directory, "haproxy.sock")
        lines, servers = [], iter(zip(backends, check_ports or [None] * len(backends),
                                            strict=True))
        for line in open(template).read().splitlines():
            words = line.split()
            if words[:1] == ["bind"]:
                line = f"    bind 127.0.0.1:{self.port}"
            elif words[:1] == ["server"]:
                port, check = next(servers)
                line = f"    server {words[1]} 127.0.0.1:{port}" + \
                    (f" check port {check}" if check else "")
            elif check_ports is None and words[:2] in (["option", "httpchk"],
                                                       ["http-check", "send"],
                                                       ["http-check", "expect"]):
                continue
            lines.append(line)
            if words == ["global"]:
                lines.append(f"    stats socket {self.socket} mode 600 level admin")
        os.makedirs(directory, exist_ok=True)
        self.config = os.path.join(directory, "haproxy.cfg")
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "HAProxy":
        self.spawn([need("haproxy"), "-db", "-f", self.config], "haproxy.log", self._listening)
        return self

    def _listening(self) -> bool:
        socket.create_connection(("127.0.0.1", self.port), 0.5).close()
        return os.path.exists(self.socket)

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.socket)
            s.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return b"".join(chunks).decode()
                chunks.append(chunk)

    def servers(self) -> "dict[str, dict]":
        """{server name: {"status": "UP"/"DOWN"/..., "sessions": current connections,
        "total": connections ever}}."""
        rows = self.command("show stat").splitlines()
        header = rows[0].lstrip("# ").split(",")
        out = {}
        for row in rows[1:]:
            cells = dict(zip(header, row.split(","), strict=False))
            if cells.get("svname") not in (None, "FRONTEND", "BACKEND"):
                out[cells["svname"]] = {"status": cells["status"],
                                        "sessions": int(cells["scur"] or 0),
                                        "total": int(cells["stot"] or 0)}
        return out

    def wait_until(self, condition, timeout: float = 20.0) -> bool:
        """Whether `condition(self.servers())` held within `timeout` seconds."""
        return bool(wait_until(lambda: condition(self.servers()), timeout, poll=0.1))


class MosquittoServer(ServerProcess):
    """Debian's mosquitto on 127.0.0.1, in the foreground, no persistence (a restart forgets
    every retained message and session, as a broker that crashed does); `stop()` and `start()`
    again keep the port. `users` ({name: password}): the broker then refuses anyone else."""

    def __init__(self, directory: str, port: Optional[int] = None,
                 users: "Optional[dict[str, str]]" = None,
                 tls: "Optional[tuple[str, str, str]]" = None, acl: Optional[str] = None):
        """`tls`: (CA file, certificate, key): a second listener on `tls_port`, with TLS.
        `acl`: the path of a mosquitto ACL file to enforce (config/mosquitto.acl)."""
        self.directory = directory
        self.port = port or free_port()
        self.users = dict(users or {})
        self.tls = tls
        self.acl = acl
        self.tls_port = free_port() if tls else None
        self.process: Optional[subprocess.Popen] = None

    def start(self) -> "MosquittoServer":
        os.makedirs(self.directory, exist_ok=True)
        config = os.path.join(self.directory, "mosquitto.conf")
        # as root it would drop to the mosquitto user, who cannot read a test's folders
        lines = [f"listener {self.port} 127.0.0.1", "persistence false", "user root",
                 "set_tcp_nodelay true",
                 "log_dest stdout", "log_type error", "log_type warning", "log_type notice"]
        if self.users:
            passwords = os.path.join(self.directory, "passwords")
            open(passwords, "w").close()
            for name, secret in self.users.items():
                subprocess.run([need("mosquitto_passwd"), "-b", passwords, name, secret],
                               check=True, capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        if self.acl:
            lines.append(f"acl_file {self.acl}")
        else:
            lines.append("allow_anonymous true")
        if self.tls:
            cafile, certfile, keyfile = self.tls
            lines += [f"listener {self.tls_port} 127.0.0.1", f"cafile {cafile}",
                      f"certfile {certfile}", f"keyfile {keyfile}"]
        with open(config, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.spawn([need("mosquitto"), "-c", config], "mosquitto.log", self._listening)
        return self

    def _listening(self) -> bool:
        socket.create_connection(("127.0.0.1", self.port), 0.5).close()
        return True
