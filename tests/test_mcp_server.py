"""`hivemind-chat mcp` as MCP clients run it (the `mcp` SDK's own Client, launching the command
over stdio, or over streamable HTTP), against genuine hubs of both generations (the OVOS-like
test pipeline: tests/pipeline_agent.py)."""
import asyncio
import os
import subprocess
import sys
import time

from fronts import exited_cleanly, reap
from hubs import free_port, wait_listening
from mcp import Client, StdioServerParameters
from waiting import UNIT

CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")


def hub_args(creds, port=None):
    return ["--host", creds.host, "--port", str(port or creds.port), "--key", creds.key,
            "--password", creds.password, "--timeout", "5", "--no-store"]


def stdio(creds, port=None) -> StdioServerParameters:
    """The command as an MCP client launches it. The SDK hands the child only a few
    variables of ours (HOME, PATH...): PYTHONPATH is passed on, so the code under test is
    what runs (a worktree's, not the installed checkout's)."""
    extra = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else None
    return StdioServerParameters(command=CLI, args=["mcp", *hub_args(creds, port)], env=extra)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def ask(client, utterance, conversation=None):
    arguments = {"utterance": utterance}
    if conversation is not None:
        arguments["conversation"] = conversation
    return await client.call_tool("ask", arguments)


def test_over_stdio_one_tool_that_remembers_and_knows_a_question(creds):
    async def main():
        async with Client(stdio(creds)) as client:
            tools = (await client.list_tools()).tools
            assert [t.name for t in tools] == ["ask"]
            assert set(tools[0].input_schema["properties"]) == {"utterance", "conversation"}
            assert tools[0].input_schema["required"] == ["utterance"]
            told = await ask(client, "remember ada")
            assert not told.is_error
            recalled = await ask(client, "recall")       # the session's default conversation
            assert recalled.content[0].text == "you said ada"
            assert recalled.structured_content["expect_response"] is False
            other = await ask(client, "recall", conversation="another")
            assert other.content[0].text == "I remember nothing"
            question = await ask(client, "ask", conversation="q")
            assert question.structured_content == {
                "answer": "what is your favourite colour?", "expect_response": True,
                "conversation": "q", "complete": True}
            answer = await ask(client, "blue", conversation="q")
            assert answer.content[0].text == "blue is a fine colour"
            assert answer.structured_content["expect_response"] is False
    run(main())


def test_a_dead_hub_is_a_tool_error_naming_it(creds):
    dead = free_port()

    async def main():
        async with Client(stdio(creds, port=dead)) as client:
            failed = await ask(client, "hello")
            assert failed.is_error
            assert f"127.0.0.1:{dead}" in failed.content[0].text
    run(main())


def test_over_streamable_http_conversations_remember_and_stay_apart(creds):
    """The 2026-07-28 protocol is stateless over HTTP (no Mcp-Session-Id): calls without
    `conversation` share the server's default one; named ones stay apart."""
    port = free_port()
    server = subprocess.Popen([CLI, "mcp", "--http", f"http://127.0.0.1:{port}",
                               *hub_args(creds)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, proc=server, what="hivemind-chat mcp --http")
        url = f"http://127.0.0.1:{port}/mcp"

        async def main():
            async with Client(url) as first, Client(url) as second:
                assert [t.name for t in (await first.list_tools()).tools] == ["ask"]
                await ask(first, "remember ada")
                assert (await ask(first, "recall")).content[0].text == "you said ada"
                await ask(first, "remember ada", conversation="a")
                await ask(second, "remember bob", conversation="b")
                assert (await ask(first, "recall", "a")).content[0].text == "you said ada"
                assert (await ask(second, "recall", "b")).content[0].text == "you said bob"
                question = await ask(second, "ask", "b")
                assert question.structured_content["expect_response"] is True
        run(main())
    finally:
        server.terminate()
        server.wait(10)


def test_over_http_a_long_answer_comes_in_parts_within_the_budget(creds):
    """Home Assistant's MCP client: 10 s per call, a new MCP session per call. A 3-sentence
    answer spoken 4 s apart with --tool-timeout 3: the first call returns the first sentence
    with complete: false within the budget, the turn goes on at the hub, and calls with an
    empty utterance in that conversation return the rest, each sentence exactly once."""
    budget = 3.0
    port = free_port()
    server = subprocess.Popen([CLI, "mcp", "--http", f"http://127.0.0.1:{port}",
                               *hub_args(creds), "--tool-timeout", str(budget)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"

    async def call(utterance, conversation="story"):
        async with Client(url) as client:       # a new session per call
            start = time.monotonic()
            result = await client.call_tool("ask", {"utterance": utterance,
                                                    "conversation": conversation})
            return result, time.monotonic() - start
    within = budget + max(1.0, 3 * UNIT)
    try:
        wait_listening(port, proc=server, what="hivemind-chat mcp --http")
        hello, _ = run(call("hello"))           # the conversation's connection is up
        assert hello.structured_content["complete"] is True
        first, took = run(call("paced 3 4"))
        assert not first.is_error and took < within
        assert first.structured_content == {"answer": "paced sentence 1",
                                            "expect_response": False,
                                            "conversation": "story", "complete": False}
        assert "empty utterance" in first.content[0].text
        parts, result = [first.structured_content["answer"]], first
        for _ in range(6):                      # about 8 s of speech left, 3 s per call
            if result.structured_content["complete"]:
                break
            result, took = run(call(""))
            assert not result.is_error and took < within
            parts.append(result.structured_content["answer"])
        assert result.structured_content["complete"] is True
        said = [line for part in parts for line in part.split("\n") if line]
        assert said == ["paced sentence 1", "paced sentence 2", "paced sentence 3"]
        nothing_left, _ = run(call(""))         # collected: nothing pending any more
        assert nothing_left.is_error and "has none" in nothing_left.content[0].text
        assert run(call("hello", "other"))[0].structured_content["answer"] == "hello there"
    finally:
        server.terminate()
        server.wait(10)


def test_over_stdio_no_password_prompt_may_read_the_mcp_channel(capsys):
    from hivemind_chat_agent.bridges.cli import main
    assert main(["mcp", "--password", "-"]) == 2
    assert "would read the MCP channel" in capsys.readouterr().err


def test_over_stdio_a_stop_signal_ends_it_though_the_client_keeps_stdin_open(creds):
    """SIGTERM (what an MCP client sends when closing stdin was not enough) or SIGINT: the
    server ends, exit code 0, without waiting for the client's next line."""
    import json
    import signal
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}}
    for stop in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([CLI, "mcp", *hub_args(creds)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            proc.stdin.write(json.dumps(hello) + "\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1     # it serves
            proc.send_signal(stop)
            exited_cleanly(proc)
        finally:
            reap(proc)
            proc.stdin.close()
