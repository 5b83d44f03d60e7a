"""bridges/serving.py, the shell every front runs in: where it listens, who may reach it, and
how a stop signal drains then stops it (real signals sent to this process; no hub)."""
import asyncio
import os
import signal

import pytest

from hivemind_chat_agent.bridges import serving
from hivemind_chat_agent.core.front_guard import Keys
from hivemind_chat_agent.errors import ConfigurationError


def test_each_front_s_uri_is_parsed_and_a_wrong_one_names_the_front_s_option():
    http = serving.parse_uri("http://[::1]:8080", "--uri", ("http",), "http://127.0.0.1:8080")
    assert http == serving.Address("http", "::1", 8080)
    tcp = serving.parse_uri("tcp://:10700", "--uri", ("tcp",), "tcp://0.0.0.0:10700",
                            default_host="0.0.0.0")
    assert (tcp.host, tcp.port) == ("0.0.0.0", 10700)
    for wrong in ("https://127.0.0.1:8765", "http://127.0.0.1", "http://:8765",
                  "http://127.0.0.1:port", "http://127.0.0.1:99999", "127.0.0.1:8765"):
        with pytest.raises(ConfigurationError) as refused:
            serving.parse_uri(wrong, "--http", ("http",), "http://127.0.0.1:8765")
        assert str(refused.value) == \
            f"--http must look like http://127.0.0.1:8765, not {wrong!r}"


def test_the_a2a_card_names_a_url_clients_can_post_to():
    from hivemind_chat_agent.bridges.a2a_http import card_url, public_host
    assert card_url("127.0.0.1", "http://127.0.0.1:9999", None) == "http://127.0.0.1:9999/"
    assert card_url("192.0.2.2", "http://192.0.2.2:9999/", None) == "http://192.0.2.2:9999/"
    assert card_url("0.0.0.0", "http://0.0.0.0:9999", "http://hub.lan:9999") == \
        "http://hub.lan:9999/"
    for host in ("0.0.0.0", "::"):      # the plugins post to the card's URL: 0.0.0.0 fails
        with pytest.raises(ConfigurationError, match="needs --public-url"):
            card_url(host, f"http://{host}:9999", None)
    assert public_host("http://192.0.2.2:9999") == "192.0.2.2"      # an allowed Host then
    assert public_host("https://assistant.example.org/a2a") == "assistant.example.org"
    for wrong in ("assistant.lan:9999", "ftp://hub.lan", "http://hub.lan:port", "http://"):
        with pytest.raises(ConfigurationError, match="--public-url must look like"):
            public_host(wrong)


def test_beyond_loopback_only_with_a_key():
    for host in ("127.0.0.1", "127.9.9.9", "::1", "localhost"):
        serving.check_exposure(host, Keys())
    serving.check_exposure("0.0.0.0", Keys(["key"]))
    with pytest.raises(ConfigurationError, match="--api-key"):
        serving.check_exposure("0.0.0.0", Keys())


def test_keys_come_from_the_options_files_and_the_environment(tmp_path, monkeypatch):
    keys_file = tmp_path / "keys"
    keys_file.write_text("# ours\nfile-key\n\n  other-key  \n")
    monkeypatch.setenv(serving.API_KEY_ENV, "env-key")
    keys = serving.read_keys(["given"], [str(keys_file)])
    assert len(keys) == 4
    with pytest.raises(ConfigurationError, match="cannot read the API key file"):
        serving.read_keys([], [str(tmp_path / "none")])


def test_a_stop_signal_asks_the_server_to_drain_and_it_exits_zero():
    seen = []

    async def server(stopping):
        os.kill(os.getpid(), signal.SIGTERM)
        await stopping.wait()
        seen.append("drained")          # what was in flight finishes here
    assert serving.serve_until_signalled(server, "test://") == 0
    assert seen == ["drained"]


def test_a_second_signal_or_the_drain_deadline_stops_a_server_that_does_not_drain():
    ended = []

    async def stubborn(stopping):
        os.kill(os.getpid(), signal.SIGINT)
        await stopping.wait()
        try:
            os.kill(os.getpid(), signal.SIGINT)        # Ctrl-C again
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append("second signal")
            raise
    assert serving.serve_until_signalled(stubborn, "test://", drain=60) == 0

    async def slow(stopping):
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append("deadline")
            raise
    assert serving.serve_until_signalled(slow, "test://", drain=0.01) == 0
    assert ended == ["second signal", "deadline"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # given back


def test_an_address_in_use_is_a_configuration_error_naming_it():
    async def server(stopping):
        raise OSError(98, "Address already in use")
    with pytest.raises(ConfigurationError, match="cannot listen on http://127.0.0.1:1: "
                                                 "Address already in use"):
        serving.serve_until_signalled(server, "http://127.0.0.1:1")


def test_until_stopping_ends_its_work_at_the_signal_or_with_its_error():
    async def forever():
        await asyncio.Event().wait()

    async def failing():
        raise ValueError("broken")

    async def main():
        stopping = asyncio.Event()
        asyncio.get_running_loop().call_soon(stopping.set)
        await serving.until_stopping(forever(), stopping)
        with pytest.raises(ValueError, match="broken"):
            await serving.until_stopping(failing(), asyncio.Event())
    asyncio.run(main())
