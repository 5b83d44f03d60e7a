"""`hivemind-chat a2a`'s JSON-RPC methods as a client sends them, without a hub: the real app
(bridges/a2a_http.guarded_app) on loopback with tests/test_a2a_front_security.py's agent
(a HeldTurn speaks "held" until stopped, "say WORDS" says WORDS and ends): both generations
of method names (A2A 1.0 `SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`;
0.3 `message/send`, `message/stream`, `tasks/get`, `tasks/cancel`), the bounded task store
as the SDK's handler uses it, and each key's tasks its own."""
import http.client
import json
import os
import uuid

from test_a2a_front_security import post, served

from hivemind_chat_agent.core.a2a_tasks import TaskBook

V1 = {"A2A-Version": "1.0"}
METHODS = {"1.0": ("SendMessage", "SendStreamingMessage", "GetTask", "CancelTask"),
           "0.3": ("message/send", "message/stream", "tasks/get", "tasks/cancel")}


def message(version, method, text):
    part = {"text": text} if version == "1.0" else {"kind": "text", "text": text}
    msg = {"role": "ROLE_USER" if version == "1.0" else "user",
           "messageId": uuid.uuid4().hex, "parts": [part]}
    if version == "0.3":
        msg["kind"] = "message"
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": msg}}


def call(port, version, method, params, headers=None):
    body = {"jsonrpc": "2.0", "id": 2, "method": method, "params": params}
    return post(port, body, {**(V1 if version == "1.0" else {}), **(headers or {})})[1]


def task_of(version, result):
    """A task from SendMessage's result (1.0 wraps it as {"task": ...}) or from GetTask's."""
    return result.get("task", result) if version == "1.0" else result


def state_of(version, task) -> str:
    state = task["status"]["state"]
    return state.removeprefix("TASK_STATE_").lower().replace("_", "-") \
        if version == "1.0" else state


def texts(task):
    return [p["text"] for a in task.get("artifacts", []) for p in a["parts"]]


def say(port, version, text, headers=None):
    status, body = post(port, message(version, METHODS[version][0], text),
                         {**(V1 if version == "1.0" else {}), **(headers or {})})
    assert status == 200, body
    return task_of(version, body["result"])


def events_until_held(conn, port, version, text="talk"):
    """A streamed message, read until its first sentence: (the task id, the response)."""
    conn.request("POST", "/", json.dumps(message(version, METHODS[version][1], text)),
                 {"Content-Type": "application/json", "Accept": "text/event-stream",
                  **(V1 if version == "1.0" else {})})
    response = conn.getresponse()
    assert response.status == 200
    for line in iter(response.readline, b""):
        if line.startswith(b"data:") and b"held" in line:
            event = json.loads(line[5:])["result"]
            update = event.get("artifactUpdate", event)
            return update["taskId"], response
    raise AssertionError("the stream ended before its first sentence")


def rest_of(response):
    return [json.loads(line[5:])["result"] for line in iter(response.readline, b"")
            if line.startswith(b"data:")]


def test_both_generations_of_method_names_send_stream_get_and_cancel():
    with served() as (port, agent):
        for version, (_send, _stream, get, cancel) in METHODS.items():
            task = say(port, version, "say one")
            assert state_of(version, task) == "completed", version
            assert texts(task) == ["one"]
            for other in METHODS:          # a task is the same whichever names ask for it
                got = call(port, other, METHODS[other][2], {"id": task["id"]})["result"]
                assert (got["id"], texts(got)) == (task["id"], ["one"])
                assert state_of(other, got) == "completed"
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            task_id, response = events_until_held(conn, port, version)
            turn = agent.turns[-1]
            cancelled = call(port, version, cancel, {"id": task_id})["result"]
            assert state_of(version, cancelled) == "canceled", version
            assert turn.terminated.is_set()          # the turn stopped at the hub
            last = rest_of(response)[-1]
            assert state_of(version, last.get("statusUpdate", last)) == "canceled"
            conn.close()
            assert call(port, version, get, {"id": "no-such-task"})["error"]["message"] == \
                "Task not found"
        unknown = call(port, "0.3", "tasks/shred", {})
        assert unknown["error"]["code"] == -32601           # method not found
        # a 1.0 name without the 1.0 header is a 0.3 client's mistake, said so
        refused = post(port, message("1.0", "SendMessage", "say x"))[1]
        assert "not supported" in refused["error"]["message"]


def test_the_task_store_keeps_running_tasks_and_forgets_the_oldest_ended_ones():
    with served(book=TaskBook(max_tasks=2)) as (port, agent):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        running, response = events_until_held(conn, port, "0.3")
        ended = [say(port, "0.3", f"say {n}")["id"] for n in range(3)]
        got = {task_id: call(port, "0.3", "tasks/get", {"id": task_id})
               for task_id in [running, *ended]}
        assert [("error" in got[task_id]) for task_id in ended] == [True, True, False]
        assert got[running]["result"]["status"]["state"] == "working"    # always kept
        assert call(port, "0.3", "tasks/cancel", {"id": running})["result"]["status"][
            "state"] == "canceled"
        rest_of(response)
        conn.close()


def test_a_key_s_tasks_are_its_own():
    """GetTask and CancelTask with another key find nothing, as if the task did not exist."""
    with served(keys=["key-a", "key-b"]) as (port, agent):
        a, b = ({"Authorization": f"Bearer key-{k}"} for k in "ab")
        task = say(port, "0.3", "say mine", a)
        assert call(port, "0.3", "tasks/get", {"id": task["id"]}, b)["error"]["message"] == \
            "Task not found"
        assert "error" in call(port, "0.3", "tasks/cancel", {"id": task["id"]}, b)
        assert texts(call(port, "0.3", "tasks/get", {"id": task["id"]}, a)["result"]) == \
            ["mine"]
        # nor may another key continue it
        reply = post(port, {**message("0.3", "message/send", "say again"), "params": {
            "message": {**message("0.3", "message/send", "x")["params"]["message"],
                        "taskId": task["id"], "contextId": task["contextId"]}}}, b)[1]
        assert "error" in reply


def test_the_sdk_s_tracing_is_off_unless_asked_for(monkeypatch):
    from hivemind_chat_agent.bridges.a2a_http import SDK_TRACING, quiet_sdk_tracing
    monkeypatch.delenv(SDK_TRACING, raising=False)
    quiet_sdk_tracing()
    assert os.environ[SDK_TRACING] == "false"
    monkeypatch.setenv(SDK_TRACING, "true")
    quiet_sdk_tracing()
    assert os.environ[SDK_TRACING] == "true"


def test_the_command_off_loopback_without_a_key_is_refused_before_the_hub_is_dialled():
    """Port 1 of loopback as the hub: reached, it would be an error naming it; refused first.
    The command runs as people run it, in a process of its own: `cli.main` sets the process's
    log level and blocks its signals (in this process that hid every later test's WARNINGs
    and blocked SIGINT in the CLI children they spawn)."""
    import subprocess
    import sys
    command = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
    hub = ["--host", "127.0.0.1", "--port", "1", "--key", "k", "--password-file", os.devnull]
    for extra, words in ((["--uri", "http://0.0.0.0:9999", "--public-url", "http://hub.lan:9999"],
                          "--api-key"),
                         (["--uri", "http://0.0.0.0:9999"], "needs --public-url"),
                         (["--max-tasks", "0"], "--max-tasks must be at least 1")):
        out = subprocess.run([command, "a2a", *extra, *hub], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode != 0, extra
        said = out.stdout + out.stderr
        assert words in said and "out of reach" not in said, said
