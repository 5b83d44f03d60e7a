"""hivemind-chat driven as a person would: in a real pseudo-terminal (pexpect)."""
import json
import os
import subprocess
import sys
import tempfile

import pexpect
import pytest
from waiting import hold_still, wait_until

CLI = os.path.join(os.path.dirname(sys.executable), "hivemind-chat")
# the CLI keeps conversations under $XDG_STATE_HOME: never the real one of whoever runs the tests
STATE = tempfile.mkdtemp(prefix="hm-test-cli-state-")
CLI_ENV = {**os.environ, "XDG_STATE_HOME": STATE}


def hub_args(creds, host="127.0.0.1"):
    """The command-line options that point the CLI at a test hub as a registered client."""
    return ["--host", host, "--port", str(creds.port), "--key", creds.key,
            "--password", creds.password]


def spawn(*args, env=None):
    return pexpect.spawn(CLI, list(args), encoding="utf-8", timeout=60,
                         dimensions=(40, 160), env=env or dict(CLI_ENV))


def waits_for_a_key(pid):
    """Whether process `pid`'s main thread sleeps in select() or poll(), where readline waits
    for a key (/proc/PID/wchan; where the kernel does not say, after a few UNITs)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
    except OSError:
        wchan = ""
    if not wchan or wchan == "0":
        hold_still(2)
        return True
    return "poll" in wchan or "select" in wchan


def finish(child):
    child.expect(pexpect.EOF)
    child.close()
    assert not child.isalive()
    with pytest.raises(ProcessLookupError):      # nothing left behind under that pid
        os.kill(child.pid, 0)
    return child.exitstatus


@pytest.mark.hub     # the demo starts an embedded hub
def test_demo_chat_remembers_a_name_within_a_session_only():
    child = spawn("demo")
    child.expect(r"\[default\] you> ")
    child.sendline("my name is Ada")
    child.expect(r"hub> .*Ada")
    child.expect(r"you> ")
    child.sendline("what is my name")
    child.expect(r"hub> Your name is Ada")
    child.expect(r"you> ")
    child.sendline("/session elsewhere")
    child.expect(r"\[elsewhere\] you> ")
    child.sendline("what is my name")
    child.expect(r"hub> I don't know your name yet")
    child.expect(r"you> ")
    child.sendline("/session default")
    child.expect(r"\[default\] you> ")
    child.sendline("what is my name")
    child.expect(r"hub> Your name is Ada")
    child.expect(r"you> ")
    child.sendeof()                                # Ctrl-D
    assert finish(child) == 0


@pytest.mark.hub
def test_demo_one_shot_prints_and_exits_zero():
    child = spawn("demo", "hello")
    child.expect(r"hub> \S+")
    assert finish(child) == 0


@pytest.mark.hub
def test_ctrl_c_at_the_prompt_leaves_cleanly():
    child = spawn("demo")
    child.expect(r"you> ")
    # CPython's readline notices a signal only while it sits in select(): one arriving in the
    # microseconds between writing the prompt and that call is seen at the next key. A person
    # never hits that window; a test sending ^C the instant the prompt appears, while the demo
    # hub still finishes the interactive chat's connection, sometimes did. So: ^C once the
    # CLI's main thread waits for a key there.
    assert wait_until(lambda: waits_for_a_key(child.pid), 30), "readline never waited"
    child.sendintr()
    assert finish(child) == 0


def test_ctrl_c_mid_answer_stops_it_and_the_chat_goes_on(creds):
    child = spawn(*hub_args(creds), "--session", "cli-barge")
    child.expect(r"you> ")
    child.sendline("slow 20 0.3")
    child.expect(r"hub> slow sentence 1")
    child.sendintr()
    child.expect(r"\(answer stopped\)")
    child.expect(r"you> ")
    child.sendline("count 2")
    child.expect(r"hub> sentence 1\r\n\s+sentence 2")
    assert "slow sentence 3" not in child.before
    child.sendline("/quit")
    assert finish(child) == 0


def test_one_shot_against_a_configured_hub(creds):
    child = spawn(*hub_args(creds, host="ws://127.0.0.1"), "count 2")
    child.expect(r"hub> sentence 1\r\n\s+sentence 2")
    assert finish(child) == 0


def test_interactive_follow_up_question_keeps_the_session(creds):
    child = spawn(*hub_args(creds), "--session", "cli-follow")
    child.expect(r"\[cli-follow\] you> ")
    child.sendline("ask")
    child.expect(r"hub> what is your favourite colour\?")
    child.expect(r"you> ")
    child.sendline("purple")
    child.expect(r"hub> purple is a fine colour")
    child.expect(r"you> ")
    child.sendline("/quit")
    assert finish(child) == 0


def test_speech_between_turns_is_printed_while_the_prompt_waits(creds):
    """An alarm firing while the user is at the prompt: printed at once, prompt redrawn."""
    child = spawn(*hub_args(creds), "--session", "cli-later")
    child.expect(r"\[cli-later\] you> ")
    child.sendline("later 1.5")
    child.expect(r"hub> now you wait")
    child.expect(r"you> ")
    child.expect(r"hub> the wait is over", timeout=10)    # nothing typed meanwhile
    child.expect(r"\[cli-later\] you> ")
    child.sendline("/quit")
    assert finish(child) == 0


def test_one_shot_runs_continue_the_conversation_unless_told_not_to(creds):
    args = hub_args(creds) + ["--json", "--session", "cli-store"]
    run = lambda *extra: subprocess.run([CLI, *args, *extra], capture_output=True, text=True,
                                        timeout=60, env=CLI_ENV)
    assert run("remember the blue door").returncode == 0
    recalled = [json.loads(line) for line in run("recall").stdout.splitlines()]
    assert recalled[0]["text"] == "you said the blue door"
    forgot = [json.loads(line) for line in run("recall", "--no-store").stdout.splitlines()]
    assert forgot[0]["text"] == "I remember nothing"


def test_ctrl_d_typed_while_an_answer_arrives_leaves_once_it_is_done(creds):
    child = spawn(*hub_args(creds), "--session", "cli-ctrl-d")
    child.expect(r"you> ")
    child.sendline("slow 3 0.4")
    child.expect("slow sentence 1")
    child.sendeof()                                # Ctrl-D while sentences 2 and 3 come
    child.expect("slow sentence 3")
    assert finish(child) == 0


def test_wrong_password_is_a_clear_message_and_nonzero_exit(creds):
    child = spawn("--host", "127.0.0.1", "--port", str(creds.port), "--key", creds.key,
                  "--password", "-", "hello")
    child.expect("HiveMind password: ")
    child.sendline("not-the-password")
    child.expect(r"error: .*password is wrong")
    before = child.before
    assert finish(child) == 1
    assert "Traceback" not in before and "not-the-password" not in before


def test_unreachable_hub_is_a_clear_message(creds):
    child = spawn("--host", "127.0.0.1", "--port", "1", "--key", "k", "--password", "p",
                  "--timeout", "2", "hello")
    child.expect(r"error: .*hivemind-core is running")
    assert finish(child) == 1


def test_json_lines_for_scripts(creds):
    out = subprocess.run([CLI, "--json", *hub_args(creds), "--session", "scripted"],
                         input="count 2\nfail\n", capture_output=True, text=True, timeout=60,
                         env=CLI_ENV)
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert out.returncode == 0
    assert [(e["type"], e.get("text")) for e in events] == [
        ("sentence", "sentence 1"), ("sentence", "sentence 2"), ("end", None), ("end", None)]
    assert events[0]["session"] == "scripted" and events[3]["sentences"] == 0
    assert [e["status"] for e in events if e["type"] == "end"] == ["answered", "not_understood"]


def test_no_hub_configured_points_to_set_identity_and_the_demo(tmp_path):
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    out = subprocess.run([CLI, "hello"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "set-identity" in out.stderr and "hivemind-chat demo" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_command_in_process_leaves_the_callers_signal_mask_and_log_level():
    """cli.main blocks SIGINT/SIGTERM in its thread and quiets the logs while it runs; called
    in a test's (or an embedder's) process it must hand both back: left blocked, SIGINT never
    reached the CLI children later tests spawned, and their WARNING spies saw nothing."""
    import signal

    from ovos_utils.log import LOG

    from hivemind_chat_agent.bridges import cli
    mask, level = signal.pthread_sigmask(signal.SIG_BLOCK, []), LOG.level
    assert cli.main(["a2a", "--max-tasks", "0", "--host", "127.0.0.1", "--port", "1",
                     "--key", "k", "--password-file", os.devnull]) != 0
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    assert LOG.level == level
