"""The HTTP fronts as the tests run them: `hivemind-chat openai`'s server in-process (`Server`,
`running`), the command itself (`front_command`), one chat turn through the official `openai`
client (`say`), and waiting for a state (`until`). Shared by test_openai_server.py and
test_front_security.py."""
import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from typing import Iterator

import openai
from hubs import free_port, wait_listening

from hivemind_chat_agent.bridges.http_front import Limits
from hivemind_chat_agent.bridges.openai_api import OpenAIBridge
from hivemind_chat_agent.bridges.openai_http import serve
from hivemind_chat_agent.core.front_guard import FrontGuard, Keys

CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")


class Server:
    """serve() on an event loop of its own thread, as `hivemind-chat openai` runs it, stopped
    as a stop signal stops it (its `stopping` event: drained, then ended). `api_keys`: the
    keys it accepts (none: loopback without keys); `host`: where it binds; `guard` options
    and `limits` as the command line gives them; `metrics`: a FrontMetrics for /metrics."""

    def __init__(self, agent, api_keys=(), host="127.0.0.1", limits=None, metrics=None,
                 **guard):
        self.port = free_port()
        self.host = host
        self.bridge = OpenAIBridge(agent)
        self.guard = FrontGuard(host, Keys(api_keys), what="OpenAI API server", **guard)
        self.loop = asyncio.new_event_loop()
        self.stopping = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(
            self.bridge, host, self.port, self.guard, limits or Limits(),
            stopping=self.stopping, metrics=metrics),),
            daemon=True)
        self.thread.start()
        wait_listening(self.port, 10, what="the OpenAI server", host=host)

    def client(self, api_key="unused", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://{self.host}:{self.port}/v1", api_key=api_key,
                             max_retries=0, **kw)

    def stop(self):
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)
        assert not self.thread.is_alive(), "the OpenAI server did not stop"
        self.loop.close()


@contextlib.contextmanager
def running(agent, **options) -> Iterator[Server]:
    """A Server of `agent` (options as Server takes them), stopped on leaving: what the test
    modules' `served` fixture yields."""
    server = Server(agent, **options)
    try:
        yield server
    finally:
        server.stop()


def say(client, *messages, **kw) -> str:
    """The answer to the last of `messages`, the ones before it the chat's history."""
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
               for i, text in enumerate(messages)]
    reply = client.chat.completions.create(model="anything", messages=history, **kw)
    return reply.choices[0].message.content


def until(condition, timeout: float, what: str, every: float = 0.01) -> None:
    """Until `condition()` holds, asked every `every` seconds: for a state nothing announces
    (a hub's count of answers going on, a guard's requests in flight). AssertionError naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()           # never set: a pause between two questions
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        pause.wait(every)


def hub_options(creds):
    """The command-line options pointing a front at the hub of `creds`."""
    return ["--host", creds.host, "--port", str(creds.port), "--key", creds.key,
            "--password", creds.password, "--timeout", "5", "--no-store"]


def exited_cleanly(proc: subprocess.Popen, timeout: float = 30) -> None:
    """A front told to stop exits 0 within `timeout` and wrote no traceback."""
    assert proc.wait(timeout) == 0
    assert "Traceback" not in proc.stderr.read()


def reap(proc: subprocess.Popen) -> None:
    """A front the test left running is killed; either way it is waited for (no zombie)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def front_command(*argv, **popen) -> subprocess.Popen:
    """`hivemind-chat ARGV...` as a process of its own (stdout and stderr to a pipe each)."""
    return subprocess.Popen([CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)
