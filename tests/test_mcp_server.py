"""`hivemind-chat mcp` as MCP clients run it (the `mcp` SDK's own Client, launching the command
over stdio, or over streamable HTTP), against genuine hubs of both generations (the OVOS-like
test pipeline: tests/pipeline_agent.py)."""
import asyncio
import os
import subprocess
import sys

from fronts import exited_cleanly, reap
from hubs import free_port, wait_listening
from mcp import Client, StdioServerParameters

CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")


def hub_args(creds, port=None):
    return ["--host", creds.host, "--port", str(port or creds.port), "--key", creds.key,
            "--password", creds.password, "--timeout", "5", "--no-store"]


def stdio(creds, port=None) -> StdioServerParameters:
    return StdioServerParameters(command=CLI, args=["mcp", *hub_args(creds, port)])


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
                "conversation": "q"}
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
