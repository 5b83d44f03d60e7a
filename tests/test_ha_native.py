"""The native Home Assistant integration's decisions (hivemind_chat_agent/bridges/ha_native.py),
without Home Assistant: the form errors, the session of a conversation, the streamed deltas
and what an ended turn means to HA. tests/test_home_assistant_native.py runs them in a
genuine HA."""
import asyncio

import pytest

from hivemind_chat_agent.bridges.ha_native import (
    NO_INTENT_MATCH,
    SEPARATOR,
    TurnReport,
    agent_config,
    answer_for,
    failure_answer,
    flow_error,
    hub_name,
    needs_reauth,
    run_turn,
    sentence_deltas,
    session_for,
)
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.core.outcomes import TurnStatus
from hivemind_chat_agent.errors import (
    AccessKeyRejectedError,
    ClientKeyRefusedError,
    ConfigurationError,
    ConnectionLostError,
    HandshakeTimeoutError,
    HubCertificateChangedError,
    HubCertificateError,
    HubEngineError,
    HubKeyChangedError,
    HubUnreachableError,
    PolicyDeniedError,
    TurnTimeoutError,
    WrongPasswordError,
)

DATA = {"host": "192.0.2.7", "port": 5678, "access_key": "k" * 32, "password": "p" * 32}


@pytest.mark.parametrize("error, form_error", [
    (HubKeyChangedError("x"), "hub_key_changed"),
    (HubCertificateChangedError("x"), "hub_key_changed"),
    (WrongPasswordError("x"), "invalid_auth"),
    (AccessKeyRejectedError("x"), "invalid_auth"),
    (ClientKeyRefusedError("x"), "invalid_auth"),
    (HubCertificateError("x"), "invalid_auth"),
    (HubUnreachableError("x"), "cannot_connect"),
    (HandshakeTimeoutError("x"), "cannot_connect"),
    (ConnectionLostError("x"), "cannot_connect"),
    (ConnectionRefusedError(), "cannot_connect"),
    (ConfigurationError("x"), "invalid_config"),
    (HubEngineError("x"), "unknown"),
])
def test_each_failure_to_connect_has_its_form_error(error, form_error):
    assert flow_error(error) == form_error


def test_the_agent_config_of_an_entry_is_one_the_client_takes(tmp_path):
    config = agent_config(DATA, {"timeout": 12}, str(tmp_path))
    cfg = ClientConfig.from_dict(config)
    assert (cfg.host, cfg.port, cfg.key, cfg.password) == ("192.0.2.7", 5678, "k" * 32,
                                                           "p" * 32)
    assert cfg.timeout == 12
    assert cfg.noise_key_dir == str(tmp_path / "noise")
    assert cfg.session_store == str(tmp_path / "sessions")
    assert agent_config({**DATA, "port": None}, {}, str(tmp_path))["timeout"] == 30
    assert hub_name(DATA) == "192.0.2.7:5678"


def test_each_conversation_is_one_session_and_entries_never_share_one():
    a, site = session_for("entry1", "conv-a", "dev-1", None, per_device=False)
    assert session_for("entry1", "conv-a", "dev-2", None, per_device=False)[0] == a
    assert session_for("entry1", "conv-b", "dev-1", None, per_device=False)[0] != a
    assert session_for("entry2", "conv-a", "dev-1", None, per_device=False)[0] != a
    assert site == "dev-1"
    assert session_for("e", None, None, None, per_device=False) == \
        session_for("e", None, None, None, per_device=False)
    assert session_for("e", None, None, None, per_device=False)[1] == "home-assistant"


def test_per_device_one_session_per_satellite_whatever_the_conversation():
    one = session_for("e", "conv-a", "dev-1", "sat-1", per_device=True)
    assert session_for("e", "conv-b", "dev-1", "sat-1", per_device=True) == one
    assert one[1] == "sat-1"
    assert session_for("e", "conv-a", "dev-1", "sat-2", per_device=True)[0] != one[0]
    # no device to key on: per conversation after all
    assert session_for("e", "conv-a", None, None, per_device=True)[0] != \
        session_for("e", "conv-b", None, None, per_device=True)[0]


def test_long_ids_are_bounded_and_stay_apart():
    long_a, long_b = "a" * 300 + "1", "a" * 300 + "2"
    sid_a = session_for("e", long_a, None, None, per_device=False)[0]
    sid_b = session_for("e", long_b, None, None, per_device=False)[0]
    assert sid_a != sid_b and len(sid_a) < 100


class FakeTurn:
    """What sentence_deltas reads of a ChatTurn: async iteration, status, expect_response."""

    def __init__(self, sentences, status=TurnStatus.ANSWERED, asked=False, error=None):
        self._sentences, self.status, self.expect_response = sentences, status, asked
        self._error = error

    async def __aiter__(self):
        for sentence in self._sentences:
            await asyncio.sleep(0)
            yield sentence
        if self._error is not None:
            raise self._error


def deltas(turn):
    report = TurnReport()

    async def collect():
        return [d async for d in sentence_deltas(turn, report)]
    return asyncio.run(collect()), report


def test_each_sentence_is_a_delta_the_first_starting_the_message():
    got, report = deltas(FakeTurn(["one.", "two.", "three."]))
    assert got == [{"role": "assistant", "content": "one."},
                   {"content": SEPARATOR + "two."}, {"content": SEPARATOR + "three."}]
    assert "".join(d["content"] for d in got) == SEPARATOR.join(report.sentences)
    answer = answer_for(report, "hub:1")
    assert (answer.speech, answer.error_code, answer.continue_conversation) == \
        ("one.\ntwo.\nthree.", None, False)


def test_continue_conversation_exactly_when_the_hub_asked():
    _, report = deltas(FakeTurn(["which room?"], TurnStatus.ASKED, asked=True))
    assert answer_for(report, "hub:1").continue_conversation is True
    # a question mark alone is no question of the hub's (HA's LLM integrations guess so)
    _, report = deltas(FakeTurn(["did you know?"], TurnStatus.ANSWERED))
    assert answer_for(report, "hub:1").continue_conversation is False


def test_an_error_after_sentences_keeps_what_was_said():
    _, report = deltas(FakeTurn(["first."], error=ConnectionLostError("gone")))
    assert isinstance(report.error, ConnectionLostError)
    answer = answer_for(report, "hub:1")
    assert (answer.speech, answer.error_code, answer.continue_conversation) == \
        ("first.", None, False)


def test_nothing_said_is_an_error_naming_the_hub_never_quoting_the_agent():
    secret = "ws://user:hunter2@10.0.0.9 /root/.config"
    for error in (HubUnreachableError(secret), TurnTimeoutError(secret),
                  WrongPasswordError(secret), HubKeyChangedError(secret),
                  PolicyDeniedError(secret), HubEngineError(secret)):
        answer = failure_answer(error, "10.0.0.9:5678")
        assert "10.0.0.9:5678" in answer.speech and "hunter2" not in answer.speech
        assert answer.error_code and not answer.continue_conversation
    got, report = deltas(FakeTurn([], error=HubUnreachableError(secret)))
    assert got == [] and "can't reach the OVOS hub at hub:1" in answer_for(report,
                                                                          "hub:1").speech


def test_nothing_understood_and_silence():
    _, report = deltas(FakeTurn([], TurnStatus.NOT_UNDERSTOOD))
    assert answer_for(report, "hub:1").error_code == NO_INTENT_MATCH
    _, report = deltas(FakeTurn([], TurnStatus.TIMED_OUT))
    assert "took too long" in answer_for(report, "hub:1").speech


class FakeAgent:
    """abegin() as HiveMindChatAgent's: a turn, or its typed error."""

    def __init__(self, turn=None, error=None):
        self.turn, self.error, self.calls = turn, error, []

    async def abegin(self, messages, session_id, lang, site_id):
        self.calls.append((messages[-1]["content"], session_id, lang, site_id))
        if self.error is not None:
            raise self.error
        return self.turn


class RunningTurn(FakeTurn):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.terminated = False

    def is_running(self):
        return not self.terminated

    def terminate(self):
        self.terminated = True


def test_run_turn_sends_the_utterance_and_reports_what_came_back():
    turn = RunningTurn(["hi."], TurnStatus.ASKED, asked=True)
    agent = FakeAgent(turn)
    report = asyncio.run(run_turn(agent, "hello", session_id="s", lang="de-DE", site_id="k"))
    assert agent.calls == [("hello", "s", "de-DE", "k")]
    assert (report.sentences, report.asked, report.error) == (["hi."], True, None)
    assert turn.terminated          # still "running" when read: stopped at the hub


def test_run_turn_keeps_a_typed_error_in_the_report():
    report = asyncio.run(run_turn(FakeAgent(error=HubUnreachableError("x")), "hello",
                                  session_id="s", lang=None, site_id=None))
    assert isinstance(report.error, HubUnreachableError) and report.sentences == []


def test_a_turn_the_caller_gives_up_on_is_terminated():
    turn = RunningTurn(["one.", "two."])

    async def give_up(deltas):
        async for _delta in deltas:
            raise asyncio.CancelledError

    async def main():
        with pytest.raises(asyncio.CancelledError):
            await run_turn(FakeAgent(turn), "talk", session_id="s", lang=None, site_id=None,
                           consume=give_up)
        await asyncio.sleep(0.05)     # the terminate runs off the loop
    asyncio.run(main())
    assert turn.terminated


def test_reauth_only_when_new_credentials_can_help():
    assert needs_reauth(WrongPasswordError("x")) and needs_reauth(AccessKeyRejectedError("x"))
    assert not needs_reauth(HubKeyChangedError("x"))        # another hub: not a password
    assert not needs_reauth(HubUnreachableError("x")) and not needs_reauth(None)
