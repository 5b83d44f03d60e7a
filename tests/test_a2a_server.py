"""`hivemind-chat a2a` as A2A clients use it: the official `a2a-sdk` client against the command
itself, in front of genuine hubs of both generations (the OVOS-like test pipeline,
tests/pipeline_agent.py, for memory and questions; tests/engines.py's ScriptEngine for a long
answer to cancel)."""
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from fronts import until
from hubs import HubProcess, free_port, plugin_config, wait_listening

CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")


def hub_args(creds, port=None, store=False):
    return ["--host", creds.host, "--port", str(port or creds.port), "--key", creds.key,
            "--password", creds.password, "--timeout", "5", *([] if store else ["--no-store"])]


@contextlib.contextmanager
def a2a_command(creds, *extra, hub_port=None, state=None):
    """The command on a free loopback port; yields its base URL. `state`: a directory for
    its session store ($XDG_STATE_HOME); without it, no store."""
    port = free_port()
    env = {**os.environ, "XDG_STATE_HOME": str(state)} if state else None
    proc = subprocess.Popen([CLI, "a2a", "--uri", f"http://127.0.0.1:{port}", *extra,
                             *hub_args(creds, hub_port, store=bool(state))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat a2a")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


@contextlib.asynccontextmanager
async def a2a_client(url, stream=False, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        factory = ClientFactory(ClientConfig(streaming=stream, httpx_client=http))
        client = await factory.create_from_url(url)
        try:
            yield client
        finally:
            await client.close()


def message(text, context_id="", task_id=""):
    return SendMessageRequest(message=Message(
        role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=[Part(text=text)],
        context_id=context_id, task_id=task_id))


async def send(client, text, context_id="", task_id=""):
    """Every StreamResponse of one message, and the task as it ended."""
    events = [e async for e in client.send_message(message(text, context_id, task_id))]
    final = [e.task for e in events if e.HasField("task")]
    task = final[-1] if final else None
    if task is None or task.status.state in (TaskState.TASK_STATE_WORKING,
                                             TaskState.TASK_STATE_SUBMITTED):
        task_id = next(e.status_update.task_id for e in events if e.HasField("status_update"))
        task = await client.get_task(GetTaskRequest(id=task_id))
    return events, task


def answer_of(task) -> str:
    """The task's text as ovos-a2a-solver-plugin reads it: an artifact's parts joined
    without a separator, artifacts with a newline."""
    return "\n".join("".join(p.text for p in a.parts) for a in task.artifacts)


def streamed(events):
    return [p.text for e in events if e.HasField("artifact_update")
            for p in e.artifact_update.artifact.parts]


def test_the_card_a_plain_and_a_streamed_answer(creds):
    with a2a_command(creds) as url:
        async def main():
            card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=10).json()
            assert card["name"] == "HiveMind OVOS hub"
            assert card["capabilities"]["streaming"] is True
            assert [s["name"] for s in card["skills"]] == ["ask the OVOS hub"]
            assert "securitySchemes" not in card          # no key: loopback only
            async with a2a_client(url) as plain:
                _, task = await send(plain, "count 3")
                assert task.status.state == TaskState.TASK_STATE_COMPLETED
                text = answer_of(task)
            async with a2a_client(url, stream=True) as streaming:
                events, task = await send(streaming, "count 3")
                assert task.status.state == TaskState.TASK_STATE_COMPLETED
            said = streamed(events)
            assert said == ["sentence 1", "sentence 2", "sentence 3"]   # one update each
            assert "\n".join(said) == text == answer_of(task)
            ends = [e.status_update.status.state for e in events if e.HasField("status_update")]
            assert ends[-1] == TaskState.TASK_STATE_COMPLETED
        run(main())


def test_a_context_is_one_conversation_and_contexts_stay_apart(creds):
    with a2a_command(creds) as url:
        async def main():
            async with a2a_client(url) as client:
                _, first = await send(client, "remember ada")
                context = first.context_id
                assert context                           # a new context was made
                _, recalled = await send(client, "recall", context_id=context)
                assert answer_of(recalled) == "you said ada"
                assert recalled.context_id == context and recalled.id != first.id
                _, other = await send(client, "recall")
                assert other.context_id != context
                assert answer_of(other) == "I remember nothing"
        run(main())


def test_a_context_outlives_a_restart_of_the_server(hub, tmp_path):
    """The same contextId after a restart is the same OVOS session (the session store); a
    client of its own, as its store holds the client's own keys."""
    creds = hub.add_client()

    async def say(url, text, context_id=""):
        async with a2a_client(url) as client:
            return (await send(client, text, context_id))[1]
    with a2a_command(creds, state=tmp_path) as url:
        context = run(say(url, "remember ada")).context_id
    with a2a_command(creds, state=tmp_path) as url:
        assert answer_of(run(say(url, "recall", context))) == "you said ada"
        assert answer_of(run(say(url, "recall"))) == "I remember nothing"


def test_a_question_is_input_required_and_the_next_message_answers_it(creds):
    with a2a_command(creds) as url:
        async def main():
            async with a2a_client(url, stream=True) as client:
                _, asked = await send(client, "ask")
                assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
                assert answer_of(asked) == "what is your favourite colour?"
                assert not asked.status.HasField("message")    # or clients say it twice
                _, answered = await send(client, "blue", context_id=asked.context_id,
                                         task_id=asked.id)
                assert answered.id == asked.id
                assert answered.status.state == TaskState.TASK_STATE_COMPLETED
                # its artifacts are the answer's turn alone (clients that read them at the
                # end say no question twice); the question went into its history, in order
                assert answer_of(answered) == "blue is a fine colour"
                got = await client.get_task(GetTaskRequest(id=asked.id))
                assert got.status.state == TaskState.TASK_STATE_COMPLETED
                assert [(m.role, [p.text for p in m.parts]) for m in got.history] == [
                    (Role.ROLE_USER, ["ask"]),
                    (Role.ROLE_AGENT, ["what is your favourite colour?"]),
                    (Role.ROLE_USER, ["blue"])]
                with pytest.raises(Exception, match="terminal state"):   # ended: not continued
                    await send(client, "red", context_id=asked.context_id, task_id=asked.id)
        run(main())


def test_the_0_3_method_names_older_clients_use(creds):
    """`message/send` and `message/stream` with 0.3's shapes (parts with `kind`), as the
    ecosystem's plugins of 2026 send them: the answer in the task's artifacts."""
    def rpc(method, text, **kw):
        return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": {
            "role": "user", "messageId": uuid.uuid4().hex, "kind": "message",
            "parts": [{"kind": "text", "text": text}], **kw}}}
    with a2a_command(creds) as url:
        sent = httpx.post(url + "/", json=rpc("message/send", "count 2"), timeout=30).json()
        task = sent["result"]
        assert task["status"]["state"] == "completed"
        texts = [p["text"] for a in task["artifacts"] for p in a["parts"]]
        assert texts == ["sentence 1", "sentence 2"]
        with httpx.stream("POST", url + "/", json=rpc("message/stream", "count 2"),
                          timeout=30) as stream:
            events = [json.loads(line[5:]) for line in stream.iter_lines()
                      if line.startswith("data:")]
        kinds = [e["result"].get("kind") for e in events]
        assert kinds.count("artifact-update") == 2
        assert events[-1]["result"]["status"]["state"] == "completed"
        streamed_texts = [p["text"] for e in events if e["result"].get("kind") ==
                          "artifact-update" for p in e["result"]["artifact"]["parts"]]
        assert streamed_texts == texts


def test_the_public_url_is_the_card_s_and_its_host_is_allowed(creds):
    """Clients post to the URL the card names (both plugins do), so --public-url's host is a
    Host the guard lets through; another name is still refused."""
    with a2a_command(creds, "--public-url", "http://agent.test:9999/") as url:
        card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=10).json()
        assert {i["url"] for i in card["supportedInterfaces"]} == {"http://agent.test:9999/"}
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
            "role": "user", "messageId": uuid.uuid4().hex, "kind": "message",
            "parts": [{"kind": "text", "text": "hello"}]}}}
        sent = httpx.post(url + "/", json=rpc, headers={"Host": "agent.test:9999"}, timeout=30)
        assert sent.json()["result"]["artifacts"][0]["parts"][0]["text"] == "hello there"
        other = httpx.post(url + "/", json=rpc, headers={"Host": "other.test:9999"}, timeout=30)
        assert other.status_code == 421


def test_a_dead_hub_is_an_error_naming_it(creds):
    dead = free_port()
    with a2a_command(creds, hub_port=dead) as url:
        async def main():
            async with a2a_client(url) as client:
                with pytest.raises(Exception) as raised:
                    await send(client, "hello")
                assert f"127.0.0.1:{dead}" in str(raised.value)
        run(main())


def test_a_wrong_key_is_refused_and_the_card_says_a_key_is_needed(creds):
    with a2a_command(creds, "--api-key", "right-key") as url:
        async def main():
            card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=10).json()
            assert "bearer" in card["securitySchemes"]
            async with a2a_client(url, key="wrong-key") as client:
                with pytest.raises(Exception, match="401"):
                    await send(client, "hello")
            refused = httpx.post(url + "/", headers={"Authorization": "Bearer wrong-key"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "message/send",
                                       "params": {}}, timeout=10)
            assert refused.status_code == 401       # a JSON-RPC error saying what to do
            assert "Incorrect API key" in refused.json()["error"]["message"]
            async with a2a_client(url, key="right-key") as client:
                _, task = await send(client, "hello")
                assert answer_of(task) == "hello there"
        run(main())


HUB_TIMEOUT = 30


@pytest.fixture(scope="module")
def talking_hub(request):
    """A hub running our plugin with tests/engines.py's ScriptEngine ("talk" answers slowly
    until stopped)."""
    hub = HubProcess(plugin_config(timeout=HUB_TIMEOUT, workers=4),
                     generation=request.param).start()
    yield hub
    hub.cleanup()


@pytest.mark.hub
@pytest.mark.parametrize("talking_hub", ["4.0", "5"], indirect=True)
def test_cancel_stops_a_long_answer_at_the_hub(talking_hub, make_agent):
    creds = talking_hub.add_client()
    probe = make_agent(talking_hub.add_client().agent_config(timeout=10))
    stops = lambda: json.loads(probe.get_response("stops", session_id="probe"))  # noqa: E731
    before = len(stops())
    with a2a_command(creds) as url:
        async def main():
            async with a2a_client(url, stream=True) as client:
                events = client.send_message(message("talk 100 1"))
                task_id = None
                async for event in events:
                    if event.HasField("artifact_update"):
                        task_id = event.artifact_update.task_id
                        break
                assert task_id
                async with a2a_client(url) as other:
                    sent = time.monotonic()     # the engine's clock too (CLOCK_MONOTONIC)
                    cancelled = await other.cancel_task(CancelTaskRequest(id=task_id))
                assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
                await events.aclose()
                return sent
        sent = run(main())
        stopped = lambda: [t for kind, t in stops()[before:] if kind == "stop_session"]  # noqa: E731
        until(stopped, 3, "the turn stopped at the hub", every=0.1)
        assert stopped()[0] - sent < 1.0            # within 1 s of the CancelTask
        until(lambda: probe.get_response("talking", session_id="probe") == "0", 3,
              "no answer going on")
