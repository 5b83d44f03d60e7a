"""`hivemind-chat wyoming` driven exactly as Home Assistant's Wyoming integration drives a
conversation service, with the real `wyoming` client library (tests/home_assistant.py). Behind
it, genuine hivemind-core hubs of both generations (the OVOS-like test pipeline); the genuine
ovos-core behind it is in test_real_ovos.py."""
import asyncio
import signal
import socket
import subprocess
import sys
import time

import pytest
from fronts import exited_cleanly, reap
from home_assistant import Server, describe, ha_turn, streamed_turn, turn
from hubs import free_port, wait_listening
from wyoming.handle import Handled, NotHandled

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.bridges.wyoming_server import SPOKEN, WyomingBridge


@pytest.fixture
def served(creds, make_agent):
    server = Server(make_agent(creds.agent_config(timeout=5)))
    yield server
    server.stop()


def test_describe_offers_one_installed_handle_program(served):
    info = asyncio.run(describe(served.port))
    installed = [p for p in info.handle if p.installed]
    assert len(installed) == 1 and installed[0].name == "hivemind-chat"
    assert installed[0].models and installed[0].models[0].installed
    assert installed[0].models[0].languages == []         # all languages by default
    assert installed[0].attribution.name and installed[0].version == "test"


def test_answers_one_and_several_sentences(served):
    answer = turn(served.port, "hello")
    assert isinstance(answer, Handled) and answer.text == "hello there"
    assert turn(served.port, "count 3").text == "sentence 1\nsentence 2\nsentence 3"


def test_not_understood_is_not_handled_with_words_a_person_hears(served):
    answer = turn(served.port, "fail")
    assert isinstance(answer, NotHandled) and answer.text == SPOKEN["not_understood"]


def test_a_conversation_keeps_its_state_and_two_never_share_it(served):
    assert turn(served.port, "remember ada", conversation_id="A").text
    assert turn(served.port, "remember bob", conversation_id="B").text
    assert turn(served.port, "recall", conversation_id="A").text == "you said ada"
    assert turn(served.port, "recall", conversation_id="B").text == "you said bob"
    # the same conversation id from another device is another conversation
    assert turn(served.port, "recall", conversation_id="A", device_id="dev-2").text == \
        "I remember nothing"


def test_a_follow_up_question_is_answered_by_the_next_transcript(served):
    assert turn(served.port, "ask", conversation_id="Q").text == \
        "what is your favourite colour?"
    assert turn(served.port, "blue", conversation_id="Q").text == "blue is a fine colour"


def test_session_per_device_and_the_satellite_as_site(creds, make_agent):
    server = Server(make_agent(creds.agent_config(timeout=5)), per_device=True)
    try:
        assert turn(server.port, "remember kitchen things", conversation_id="one",
                    satellite_id="kitchen-sat").text
        # HA starts a new conversation: the satellite's session goes on
        assert turn(server.port, "recall", conversation_id="two",
                    satellite_id="kitchen-sat").text == "you said kitchen things"
        assert turn(server.port, "whoami", conversation_id="two",
                    satellite_id="kitchen-sat").text.startswith("session ha-")
    finally:
        server.stop()


def test_twenty_conversations_at_once_without_cross_talk(served):
    async def main():
        return await asyncio.gather(*(ha_turn(served.port, f"remember word{k}",
                                              conversation_id=f"par-{k}")
                                      for k in range(20)))
    assert all(isinstance(a, Handled) for a in asyncio.run(main()))

    async def recall():
        return await asyncio.gather(*(ha_turn(served.port, "recall",
                                              conversation_id=f"par-{k}")
                                      for k in range(20)))
    assert [a.text for a in asyncio.run(recall())] == [f"you said word{k}" for k in range(20)]


def test_garbage_and_half_closed_connections_cost_only_themselves(served):
    for junk in (b"not json at all\n", b'{"type": 5}\n', b'{"type":"transcript",'
                 b'"data_length": 999999999}\n', b'{"type": "transcript", "data": {"text": 7}}\n',
                 b"\xff\xfe\x00garbage"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)          # half-closed: we send no more
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
    assert turn(served.port, "hello").text == "hello there"


def test_a_hub_that_is_down_is_not_handled_with_a_reason_and_the_server_goes_on(make_agent):
    port = free_port()                           # nothing listens there
    agent = make_agent({"host": "127.0.0.1", "port": port, "key": "k", "password": "p",
                        "connect_timeout": 1, "timeout": 2})
    server = Server(agent)
    try:
        start = time.monotonic()
        answer = turn(server.port, "hello")
        assert isinstance(answer, NotHandled) and answer.text == SPOKEN["unreachable"]
        assert time.monotonic() - start < 3
        assert asyncio.run(describe(server.port)).handle      # still serving
        assert isinstance(turn(server.port, "hello again"), NotHandled)
    finally:
        server.stop()


def test_the_command_line_serves_home_assistant(creds, tmp_path):
    port = free_port()
    cli = [sys.executable, "-m", "hivemind_chat_agent.bridges.cli", "wyoming",
           "--uri", f"tcp://127.0.0.1:{port}", "--host", "127.0.0.1",
           "--port", str(creds.port), "--key", creds.key, "--password", creds.password,
           "--no-store", "--languages", "en-US", "--zeroconf", "--no-home-control"]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat wyoming")
        info = asyncio.run(describe(port))
        assert info.handle[0].models[0].languages == ["en-US"]
        assert info.handle[0].supports_home_control is False      # --no-home-control
        assert turn(port, "count 2").text == "sentence 1\nsentence 2"
    finally:
        proc.terminate()
        proc.wait(10)
    output = proc.stderr.read() + proc.stdout.read()
    assert creds.password not in output
    assert "not announced" in output          # --zeroconf on a loopback address says so
    assert "connected to the hub" in output   # at start, not at the first transcript


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_lets_the_turn_in_flight_be_answered_then_exits_zero(creds, stop):
    """SIGTERM (systemd, docker stop) or SIGINT (Ctrl-C) while Home Assistant waits for an
    answer: no new connection is taken, that answer still comes whole, the command exits 0."""
    from wyoming.asr import Transcript
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe, Info
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hivemind_chat_agent.bridges.cli",
                             "wyoming", "--uri", f"tcp://127.0.0.1:{port}", "--host",
                             "127.0.0.1", "--port", str(creds.port), "--key", creds.key,
                             "--password", creds.password, "--no-store"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def answer_across_the_stop():
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())      # served: this connection is in
            while not Info.is_type((await client.read_event()).type):
                pass
            await client.write_event(Transcript(
                text="slow 3 0.3", context={"conversation_id": "stop"}).event())
            proc.send_signal(stop)
            while True:
                event = await client.read_event()
                if Handled.is_type(event.type) or NotHandled.is_type(event.type):
                    return event
    try:
        wait_listening(port, 30, proc=proc, what="hivemind-chat wyoming")
        answer = asyncio.run(asyncio.wait_for(answer_across_the_stop(), 60))
        assert Handled.is_type(answer.type)
        assert answer.data["text"] == "slow sentence 1\nslow sentence 2\nslow sentence 3"
        exited_cleanly(proc)
    finally:
        reap(proc)


def test_a_server_agent_is_an_ordinary_agent(creds):
    """The bridge only uses the public asyncio API (abegin): any HiveMindChatAgent works."""
    agent = HiveMindChatAgent(creds.agent_config())
    try:
        assert WyomingBridge(agent).info_event().type == "info"
    finally:
        agent.shutdown()


def test_streamed_answers_follow_the_spec_and_home_assistant_takes_them(creds, make_agent,
                                                                         served):
    """The Wyoming spec's order: handled-start, the chunks, the full handled (what Home
    Assistant reads), handled-stop; Home Assistant's own reading of it gets the whole text."""
    from wyoming.handle import HandledChunk
    plain = asyncio.run(describe(served.port)).handle[0]
    assert plain.supports_handled_streaming is False       # advertised only with --stream
    server = Server(make_agent(creds.agent_config(timeout=5)), stream=True)
    try:
        assert asyncio.run(describe(server.port)).handle[0].supports_handled_streaming
        events = asyncio.run(streamed_turn(server.port, "count 3"))
        assert [e.type for e in events] == ["handled-start", "handled-chunk", "handled-chunk",
                                            "handled-chunk", "handled", "handled-stop"]
        full = "sentence 1\nsentence 2\nsentence 3"
        assert "".join(HandledChunk.from_event(e).text for e in events[1:4]) == full
        handled = Handled.from_event(events[4])
        assert handled.text == full and handled.context == {"continue_conversation": False}
        # Home Assistant's conversation client: reads until Handled, skipping the rest
        answer = turn(server.port, "slow 2 0.2", conversation_id="ha-streamed")
        assert isinstance(answer, Handled)
        assert answer.text == "slow sentence 1\nslow sentence 2"
        failed = asyncio.run(streamed_turn(server.port, "fail"))
        assert [e.type for e in failed] == ["not-handled"]
        # a streamed question says so in its handled
        asked = asyncio.run(streamed_turn(server.port, "ask", conversation_id="s-ask"))
        assert [e.type for e in asked] == ["handled-start", "handled-chunk", "handled",
                                           "handled-stop"]
        assert Handled.from_event(asked[2]).context == {"continue_conversation": True}
    finally:
        server.stop()


def test_info_advertises_home_control_unless_told_not_to(creds, make_agent, served):
    """Home Assistant 2026.6+ gives a handle service the CONTROL feature only when its Info
    says `supports_home_control` (homeassistant/components/wyoming/conversation.py)."""
    assert asyncio.run(describe(served.port)).handle[0].supports_home_control is True
    server = Server(make_agent(creds.agent_config(timeout=5)), home_control=False)
    try:
        assert asyncio.run(describe(server.port)).handle[0].supports_home_control is False
    finally:
        server.stop()


def test_a_question_says_so_in_handleds_context(served):
    """A skill's question (expect_response) sets continue_conversation in Handled's context;
    its answer, which asks nothing, does not."""
    question = turn(served.port, "ask", conversation_id="ctx-q")
    assert question.text == "what is your favourite colour?"
    assert question.context == {"continue_conversation": True}
    answer = turn(served.port, "blue", conversation_id="ctx-q")
    assert answer.text == "blue is a fine colour"
    assert answer.context == {"continue_conversation": False}


def test_zeroconf_says_why_it_cannot_announce():
    from hivemind_chat_agent.bridges.wyoming_server import advertise
    assert "reachable from this machine only" in asyncio.run(advertise(10700, "127.0.0.1", ""))
    import importlib.util
    if importlib.util.find_spec("zeroconf") is None:
        assert "pip install" in asyncio.run(advertise(10700, "0.0.0.0", "x"))


def test_the_wyoming_command_offers_its_options_not_a_chats(capsys):
    from hivemind_chat_agent.bridges.cli import main
    with pytest.raises(SystemExit):
        main(["wyoming", "--help"])
    text = capsys.readouterr().out
    assert "--spare-connections" in text and "--uri" in text and "--key" in text
    assert "--session " not in text and "--json" not in text and "utterance" not in text
    assert "--no-home-control" in text
    import argparse

    from hivemind_chat_agent.bridges.wyoming_cli import add_options
    assert add_options(argparse.ArgumentParser()).parse_args([]).home_control is True
    with pytest.raises(SystemExit) as exited:
        main(["wyoming", "hello there"])              # not a chat: no utterance to say
    assert exited.value.code == 2
