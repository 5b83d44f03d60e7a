"""Real servers from Debian's packages for the tests (redis-server; haproxy), each on a free
loopback port, in a directory of its own, stopped by its PID."""
import os
import shutil
import socket
import subprocess
import time
from typing import Optional

from hubs import free_port


def need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise RuntimeError(f"{program} is not installed: apt-get install {program} "
                           "(.ci/run installs it)")
    return path


class RedisServer:
    """redis-server on 127.0.0.1, no persistence; `stop()` and `start()` again keep the port,
    as a Redis that goes down and comes back does."""

    def __init__(self, directory: str, port: Optional[int] = None):
        self.directory = directory
        self.port = port or free_port()
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        os.makedirs(self.directory, exist_ok=True)
        self.process = subprocess.Popen(
            [need("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.directory],
            stdout=open(os.path.join(self.directory, "redis.log"), "ab"),
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited ({self.process.returncode}); see "
                                   f"{self.directory}/redis.log")
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer PING within 20 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
