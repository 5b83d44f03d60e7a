"""`hivemind-chat`: talk to a HiveMind hub from a terminal, or try it all on an embedded hub.

    hivemind-chat "what time is it"          one turn against the configured hub
    hivemind-chat                            interactive chat
    hivemind-chat demo ["my name is Ada"]    the same against a throw-away hub on 127.0.0.1
"""
import argparse
import sys
import time
from typing import Optional

from hivemind_chat_agent import background
from hivemind_chat_agent.bridges.cli_config import BROKER_PASSWORD_ENV, PASSWORD_ENV, agent_config
from hivemind_chat_agent.bridges.cli_terminal import (
    PROMPT_ON_SCREEN,
    Output,
    Spinner,
    enable_line_editing,
    keep_typeahead,
)
from hivemind_chat_agent.bridges.serving import front_agent
from hivemind_chat_agent.errors import ConfigurationError, HiveMindChatError, MissingExtraError
from hivemind_chat_agent.extras import require

HELP_COMMANDS = """commands:
  /session NAME   switch to (or start) the conversation NAME
  /lang CODE      answer in language CODE from now on (e.g. en-US, pt-PT)
  /help           this help
  /quit           leave (Ctrl-D does the same; Ctrl-C stops a long answer)"""


def build_parser(chat: bool = True) -> argparse.ArgumentParser:
    """The hub options every command takes; with `chat`, those of a conversation too (the
    Wyoming server adds its own instead)."""
    p = argparse.ArgumentParser(
        prog="hivemind-chat",
        description="Chat with an OVOS hub over HiveMind. Use `hivemind-chat demo` to try it "
                    "on an embedded hub.",
        epilog="Credentials default to the HiveMind client identity "
               "(`hivemind-client set-identity`).")
    if chat:
        p.add_argument("utterance", nargs="*", help="say this once and exit; omit to chat")
    p.add_argument("--host", help="hub address: 127.0.0.1, ws://… or wss://…; or an MQTT "
                                  "broker a hivemind-mqtt-protocol hub is on: mqtt://… or "
                                  "mqtts://…")
    p.add_argument("--port", type=int, help="hub port (default 5678)")
    p.add_argument("--key", help="access key registered on the hub")
    p.add_argument("--password", help="password registered on the hub; '-' asks for it "
                                      "without echo (the value is never printed or logged; "
                                      "given here it shows in the process list: prefer '-', "
                                      f"--password-file or {PASSWORD_ENV})")
    p.add_argument("--password-file", metavar="PATH",
                   help="read the hub password from this file (its first line)")
    p.add_argument("--ca-file", metavar="PATH", help="wss://: verify the hub's certificate "
                   "against this PEM file (its CA or the certificate itself)")
    p.add_argument("--self-signed", action="store_true", help="wss://: pin the hub's "
                   "certificate at the first connection and accept only that one later")
    p.add_argument("--topic-prefix", metavar="PREFIX", help="mqtt://: the hub's MQTT topic "
                   "prefix (default hivemind)")
    p.add_argument("--broker-username", metavar="NAME", help="mqtt://: the broker's username; "
                   f"its password from {BROKER_PASSWORD_ENV}")
    if chat:
        p.add_argument("--session", default="default",
                       help="conversation id; turns with the same id share OVOS session "
                            "state, across runs too (kept under $XDG_STATE_HOME/hivemind-chat)")
    p.add_argument("--no-store", action="store_true",
                   help="keep no conversation state between runs")
    if chat:
        p.add_argument("--lang", help="language of the conversation, e.g. en-US")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for each sentence (rolling, default 30)")
    if chat:
        p.add_argument("--json", action="store_true",
                       help="machine-readable output: one JSON object per line")
    p.add_argument("--verbose", action="store_true", help="show library and hub logs")
    return p


class Chat:
    """Turns and commands on top of a HiveMindChatAgent; one instance per CLI run."""

    def __init__(self, agent, out: Output, session: str, lang: Optional[str]):
        self.agent, self.out, self.session, self.lang = agent, out, session, lang
        self._sub = None

    def listen(self) -> None:
        """Print what the hub says in the current conversation between turns."""
        if self._sub is not None and self._sub.session_id == \
                self.agent.sessions.resolve(self.session):
            return
        self.unlisten()
        session = self.session
        try:
            self._sub = self.agent.subscribe(session, callback=lambda text: self.out.aside(
                text, session))
        except HiveMindChatError:
            self._sub = None      # the next turn reports why

    def unlisten(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    def turn(self, utterance: str) -> None:
        from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
        start, count = time.monotonic(), 0
        with keep_typeahead(self.out.tty), Spinner(self.out.tty) as spinner:
            turn = self.agent.begin([AgentMessage(MessageRole.USER, utterance)],
                                    session_id=self.session, lang=self.lang)
            try:
                for sentence in turn:
                    spinner.stop()
                    self.out.sentence(sentence, self.session, first=count == 0)
                    count += 1
            finally:      # Ctrl-C mid-answer: barge-in, the hub stops it too
                turn.terminate()
        self.out.end(self.session, count, time.monotonic() - start, turn.status.value)

    def command(self, line: str) -> bool:
        """Handle a /command; False means leave."""
        name, _, arg = line[1:].strip().partition(" ")
        arg = arg.strip()
        if name in ("quit", "exit", "q"):
            return False
        if name == "session" and arg:
            self.session = arg
            self.listen()
            self.out.info(f"now in conversation {arg!r}")
        elif name == "lang" and arg:
            self.lang = arg
            self.out.info(f"language set to {arg}")
        else:
            self.out.info(HELP_COMMANDS)
        return True

    def interactive(self) -> int:
        history = enable_line_editing()
        if self.out.tty:
            self.out.info("Type to chat, /help for commands, Ctrl-D to leave.")
        self.listen()
        try:
            while True:
                try:
                    prompt = f"[{self.session}] you> " if self.out.tty else ""
                    PROMPT_ON_SCREEN[0] = prompt
                    line = input(prompt).strip()
                    PROMPT_ON_SCREEN[0] = ""
                except EOFError:
                    if self.out.tty:
                        print()
                    return 0
                except KeyboardInterrupt:
                    if self.out.tty:
                        print()
                    return 0
                if not line:
                    continue
                if line.startswith("/"):
                    if not self.command(line):
                        return 0
                    continue
                try:
                    self.turn(line)
                    self.listen()
                except KeyboardInterrupt:
                    self.out.info("(answer stopped)")
                except HiveMindChatError as e:
                    self.out.error(e)
        finally:
            self.unlisten()
            history()


def _quiet_logs(verbose: bool, demo: bool):
    """Library and hub logs stay off the chat unless asked for. hivemind-core resets the log
    level when it is imported, so the demo imports it first (the hub also logs access keys at
    INFO); a client-only install has no hivemind-core and needs none."""
    if demo:
        import hivemind_core.service  # noqa: F401
    from ovos_utils.log import LOG
    LOG.set_level("DEBUG" if verbose else "ERROR")


def run_chat(agent, args, out: Output) -> int:
    chat = Chat(agent, out, args.session, args.lang)
    background.unblock_signals()     # every thread of ours is started: from now on, ours
    if args.utterance:
        try:
            chat.turn(" ".join(args.utterance))
        except KeyboardInterrupt:
            return 130
        except HiveMindChatError as e:
            out.error(e)
            return 1
        return 0
    return chat.interactive()


# `hivemind-chat NAME ...`: the servers in front of the agent, each a module with
# add_options(parser), an optional check_args(args) and serve_from_cli(args, out, config),
# which runs in bridges/serving's shell (where it listens, its agent, its stop signals)
SERVERS = {
    "wyoming": ("wyoming", "hivemind-chat wyoming (Home Assistant's Wyoming Protocol)",
                "hivemind_chat_agent.bridges.wyoming_cli"),
    "openai": ("openai", "hivemind-chat openai (the OpenAI chat API)",
               "hivemind_chat_agent.bridges.openai_http"),
    "mcp": ("mcp", "hivemind-chat mcp (a Model Context Protocol server)",
            "hivemind_chat_agent.bridges.mcp_server"),
    "a2a": ("a2a", "hivemind-chat a2a (an Agent2Agent server)",
            "hivemind_chat_agent.bridges.a2a_http"),
}


def main(argv=None) -> int:
    """`hivemind-chat` (argv: its arguments). While it runs, Ctrl-C belongs to this thread
    (signals blocked elsewhere) and the libraries' logs are quiet; on return the calling
    process gets its signal mask and log level back as it had them (a caller that is not a
    fresh process, a test or an embedder, would otherwise keep SIGINT blocked, for itself
    and every child it starts, and its WARNINGs hidden)."""
    from ovos_utils.log import LOG
    mask, level = background.signal_mask(), LOG.level
    try:
        return _command(argv)
    finally:
        background.restore_signal_mask(mask)
        LOG.set_level(level)


def _command(argv=None) -> int:
    import importlib
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and (argv[0] == "demo" or argv[0] in SERVERS) else None
    demo = command == "demo"
    server = SERVERS.get(command or "")
    if command:
        argv = argv[1:]
    # a server's module imports only the standard library at the top: its options parse
    # even where its extra is missing, which is then said by name
    front = importlib.import_module(server[2]) if server else None
    parser = front.add_options(build_parser(chat=False)) if front else build_parser()
    args = parser.parse_args(argv)
    out = Output(getattr(args, "json", False))
    # Ctrl-C belongs to this thread: the libraries start threads while they load (config
    # watchers, the demo hub) and those inherit this mask; see background.py for why.
    background.block_signals()
    try:
        if demo:
            require("demo", "hivemind-chat demo (an embedded hub with a chatbot)")
        if server:
            require(server[0], server[1])
        _quiet_logs(args.verbose, demo)
        if demo:
            from hivemind_chat_agent.bridges.demo import run_demo
            return run_demo(args, out, run_chat)
        if front:
            getattr(front, "check_args", lambda args: None)(args)
            return front.serve_from_cli(args, out, agent_config(args, out))
        with front_agent(agent_config(args, out), "hivemind-chat-cli") as agent:
            return run_chat(agent, args, out)
    except ConfigurationError as e:
        out.error(e)
        if not demo and not server and not isinstance(e, MissingExtraError):
            out.info("no hub at hand? `hivemind-chat demo` starts an embedded one")
        return 2
    except HiveMindChatError as e:
        out.error(e)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:   # a bug or a library failure: still a message, not a traceback
        out.error(RuntimeError(f"unexpected {type(e).__name__}: {e} (run with --verbose and "
                               "report it)"))
        return 1


if __name__ == "__main__":
    sys.exit(main())
