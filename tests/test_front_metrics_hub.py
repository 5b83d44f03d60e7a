"""The fronts' /metrics (bridges/front_metrics.py, docs/metrics.md) as Prometheus reads them:
each command run as an operator runs it (`hivemind-chat openai|a2a|mcp --http ... --metrics`,
`hivemind-chat wyoming --metrics HOST:PORT`) in front of genuine hubs of both generations (the
OVOS-like test pipeline, tests/pipeline_agent.py), driven by the real clients (`openai`,
`a2a-sdk`, the `mcp` SDK, the `wyoming` library as Home Assistant drives it), then scraped over
HTTP and parsed with prometheus_client's own text parser: turns of known outcomes and requests
by status counted per front, a refused key counted as its 401, and /metrics itself refused
where the front refuses anything else (no key, a foreign Host)."""
import asyncio
import urllib.error
import urllib.request

import openai
import pytest
from fronts import front_command, hub_options, reap
from home_assistant import describe, turn
from hubs import free_port, wait_listening
from prometheus_client.parser import text_string_to_metric_families
from wyoming.handle import Handled, NotHandled

KEY = "metrics-test-key"


def scrape(url, **headers):
    """(status, {(sample name, sorted label items): value}) of GET `url`."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as e:
        return e.code, {}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    return status, samples


def get(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def started(proc, port, what):
    wait_listening(port, 30, proc=proc, what=what)
    return proc


def test_openai_counts_turns_by_outcome_and_requests_by_status_behind_its_key(creds):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = front_command("openai", "--uri", base, "--metrics", "--api-key", KEY,
                         *hub_options(creds))
    try:
        started(proc, port, "hivemind-chat openai --metrics")
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].message.content == "hello there"
        chunks = list(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "count 2"}], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
            "sentence 1\nsentence 2"
        with pytest.raises(openai.APIStatusError) as failed:      # nothing understood it
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "fail"}])
        assert failed.value.status_code == 502
        wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()

        # /metrics is refused as the API is: without the key, and under a foreign Host
        assert scrape(f"{base}/metrics")[0] == 401
        assert scrape(f"{base}/metrics", Authorization=f"Bearer {KEY}",
                      Host="rebound.example")[0] == 421
        status, samples = scrape(f"{base}/metrics", Authorization=f"Bearer {KEY}")
        assert status == 200
        front = {"front": "openai"}
        assert get(samples, "hivemind_chat_turns_total", outcome="answered", **front) == 2
        assert get(samples, "hivemind_chat_turns_total", outcome="not_understood",
                   **front) == 1
        assert get(samples, "hivemind_chat_turns_total", outcome="failed", **front) == 0
        assert get(samples, "hivemind_chat_turn_seconds_count", **front) == 3
        assert get(samples, "hivemind_chat_turn_first_sentence_seconds_count", **front) == 2
        assert get(samples, "hivemind_chat_turns_in_flight", **front) == 0
        requests = {dict(labels)["status"]: value for (name, labels), value in samples.items()
                    if name == "hivemind_chat_front_requests_total"}
        # this scrape is counted once answered: not in its own body
        assert requests == {"200": 2, "502": 1, "401": 2, "421": 1}
        assert get(samples, "hivemind_chat_client_reconnects_total", **front) == 0
        assert get(samples, "hivemind_chat_client_resends_total", reason="lost",
                   **front) == 0
        status, again = scrape(f"{base}/metrics", Authorization=f"Bearer {KEY}")
        assert get(again, "hivemind_chat_front_requests_total", status="200", **front) == 3
    finally:
        proc.terminate()
        reap(proc)


def test_wyoming_serves_metrics_on_a_port_of_its_own_loopback_only(creds):
    port, metrics_port = free_port(), free_port()
    proc = front_command("wyoming", "--uri", f"tcp://127.0.0.1:{port}", "--metrics",
                         f"127.0.0.1:{metrics_port}", *hub_options(creds))
    try:
        started(proc, port, "hivemind-chat wyoming --metrics")
        wait_listening(metrics_port, 10, proc=proc, what="its metrics port")
        asyncio.run(describe(port))
        assert isinstance(turn(port, "hello"), Handled)
        assert isinstance(turn(port, "count 3"), Handled)
        assert isinstance(turn(port, "fail"), NotHandled)
        import socket
        with socket.create_connection(("127.0.0.1", port), timeout=10) as garbage:
            garbage.sendall(b"this is not an event\n")
            assert garbage.recv(1) == b""          # closed unanswered
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        assert scrape(url, Host="rebound.example")[0] == 421    # a rebound web page's name
        assert scrape(url, Origin="https://evil.example")[0] == 403
        status, samples = scrape(url)
        assert status == 200
        front = {"front": "wyoming"}
        assert get(samples, "hivemind_chat_turns_total", outcome="answered", **front) == 2
        assert get(samples, "hivemind_chat_turns_total", outcome="not_understood",
                   **front) == 1
        assert get(samples, "hivemind_chat_turn_seconds_count", **front) == 3
        assert get(samples, "hivemind_chat_turn_first_sentence_seconds_count", **front) == 2
        assert get(samples, "hivemind_chat_front_requests_total", status="handled",
                   **front) == 2
        assert get(samples, "hivemind_chat_front_requests_total", status="not_handled",
                   **front) == 1
        assert get(samples, "hivemind_chat_front_requests_total", status="info",
                   **front) == 1
        assert get(samples, "hivemind_chat_front_requests_total", status="bad_event",
                   **front) == 1
        assert get(samples, "hivemind_chat_front_requests_total", status="busy",
                   **front) == 0
        assert ("hivemind_chat_turns_total", (("front", "openai"), ("outcome", "answered"))) \
            not in samples
    finally:
        proc.terminate()
        reap(proc)


def test_wyoming_metrics_beyond_loopback_need_an_allow_list():
    proc = front_command("wyoming", "--uri", "tcp://127.0.0.1:1", "--metrics",
                         "0.0.0.0:9108", "--host", "127.0.0.1", "--port", "1", "--key", "k",
                         "--password", "p")
    try:
        assert proc.wait(30) == 2
        assert "--metrics-allow-from" in proc.stderr.read()
    finally:
        reap(proc)


def test_a2a_counts_its_turns_and_a_refused_key(creds):
    from test_a2a_server import a2a_client, a2a_command, answer_of, run, send
    with a2a_command(creds, "--metrics", "--api-key", KEY) as url:
        async def main():
            async with a2a_client(url, key=KEY) as client:
                _events, task = await send(client, "hello")
                assert answer_of(task) == "hello there"
        run(main())
        request = urllib.request.Request(f"{url}/", data=b'{"jsonrpc": "2.0", "id": 1, '
                                         b'"method": "message/send", "params": {}}',
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": "Bearer wrong"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401
        assert scrape(f"{url}/metrics")[0] == 401
        status, samples = scrape(f"{url}/metrics", Authorization=f"Bearer {KEY}")
        assert status == 200
        front = {"front": "a2a"}
        assert get(samples, "hivemind_chat_turns_total", outcome="answered", **front) == 1
        assert get(samples, "hivemind_chat_turn_seconds_count", **front) == 1
        assert get(samples, "hivemind_chat_front_requests_total", status="401", **front) == 2
        assert get(samples, "hivemind_chat_front_requests_total", status="200", **front) >= 2


def test_mcp_over_http_counts_its_turns_and_without_metrics_has_no_such_path(creds):
    from mcp import Client
    from test_mcp_server import ask, hub_args, run
    for metrics in (True, False):
        port = free_port()
        proc = front_command("mcp", "--http", f"http://127.0.0.1:{port}",
                             *(["--metrics"] if metrics else []), *hub_args(creds))
        try:
            started(proc, port, "hivemind-chat mcp --http")

            async def main(port=port):
                async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                    assert (await ask(client, "hello")).content[0].text == "hello there"
            run(main())
            status, samples = scrape(f"http://127.0.0.1:{port}/metrics")
            if not metrics:
                assert status == 404           # today's behaviour: no such path
                continue
            assert status == 200
            front = {"front": "mcp"}
            assert get(samples, "hivemind_chat_turns_total", outcome="answered", **front) == 1
            assert get(samples, "hivemind_chat_turns_in_flight", **front) == 0
            assert get(samples, "hivemind_chat_front_requests_total", status="200",
                       **front) >= 1
        finally:
            proc.terminate()
            reap(proc)


def test_mcp_over_stdio_refuses_metrics():
    p = front_command("mcp", "--metrics", "--host", "127.0.0.1", "--port", "1", "--key", "k",
                      "--password", "p")
    try:
        assert p.wait(30) == 2
        assert "--metrics needs --http" in p.stderr.read()
    finally:
        reap(p)


def test_a_hub_killed_mid_answer_then_restarted_counts_the_failures_and_one_reconnect(
        own_hub, make_agent):
    """The OpenAI front in-process (as `hivemind-chat openai --metrics` runs it) on a hub of
    its own: a turn answered; a streamed one cut mid-answer by the hub's death (failed; the
    caller keeps its 200 and what came); one while the hub is down (502, never sent: failed);
    the hub back on the same port, the next turn answered on a new connection: one
    reconnect, however many turns failed in between."""
    from fronts import Server

    from hivemind_chat_agent.bridges.front_metrics import FrontMetrics
    creds = own_hub.add_client()
    agent = make_agent(creds.agent_config(timeout=20))
    metrics = FrontMetrics("openai")
    agent.observe(metrics)                          # as serve_from_cli does with --metrics
    server = Server(agent, metrics=metrics)
    base = f"http://127.0.0.1:{server.port}"
    try:
        client = server.client()
        named = {"extra_headers": {"x-conversation-id": "phoenix"}}
        assert client.chat.completions.create(model="m", messages=[
            {"role": "user", "content": "remember ada"}], **named).choices[0].message.content
        stream = client.chat.completions.create(model="m", messages=[
            {"role": "user", "content": "slow 10 0.5"}], stream=True, **named)
        said = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                said.append(chunk.choices[0].delta.content)
                if len(said) == 1:
                    own_hub.kill()
        assert 1 <= len(said) < 10
        with pytest.raises(openai.APIStatusError) as down:
            client.chat.completions.create(model="m", messages=[
                {"role": "user", "content": "recall"}], **named)
        assert down.value.status_code == 502
        own_hub.start()                             # same port, same client database
        assert client.chat.completions.create(model="m", messages=[
            {"role": "user", "content": "recall"}], **named).choices[0].message.content == \
            "you said ada"
        status, samples = scrape(f"{base}/metrics")
        assert status == 200
        front = {"front": "openai"}
        assert get(samples, "hivemind_chat_turns_total", outcome="answered", **front) == 2
        assert get(samples, "hivemind_chat_turns_total", outcome="failed", **front) == 2
        assert get(samples, "hivemind_chat_client_reconnects_total", **front) == 1
        assert get(samples, "hivemind_chat_front_requests_total", status="200", **front) == 3
        assert get(samples, "hivemind_chat_front_requests_total", status="502", **front) == 1
        assert get(samples, "hivemind_chat_turns_in_flight", **front) == 0
    finally:
        server.stop()
