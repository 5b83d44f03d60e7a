"""The hub options of every `hivemind-chat` command as an agent config, and where secrets come
from: the access key from --key or HIVEMIND_CHAT_KEY, the password from --password ('-' asks
without echo), --password-file or HIVEMIND_CHAT_PASSWORD, else the HiveMind identity. A
password on the command line shows in the process list, so it gets a note saying so. How each
server command runs its server is bridges/serving's."""
import getpass
import os
from typing import Optional

from hivemind_chat_agent.errors import ConfigurationError

KEY_ENV = "HIVEMIND_CHAT_KEY"              # the hub access key, when not given as --key
PASSWORD_ENV = "HIVEMIND_CHAT_PASSWORD"    # the hub password, when not given otherwise
BROKER_PASSWORD_ENV = "HIVEMIND_CHAT_BROKER_PASSWORD"   # an MQTT broker's password


def agent_config(args, out=None) -> dict:
    """The agent config the hub options of any command give (`out`: where notes go)."""
    config = {k: v for k, v in (("host", args.host), ("port", args.port),
                                ("key", args.key or os.environ.get(KEY_ENV) or None),
                                ("password", _password(args, out))) if v is not None}
    config.update(ca_file=getattr(args, "ca_file", None),
                  self_signed=getattr(args, "self_signed", False))
    for key, value in (("topic_prefix", getattr(args, "topic_prefix", None)),
                       ("broker_username", getattr(args, "broker_username", None)),
                       ("broker_password", os.environ.get(BROKER_PASSWORD_ENV))):
        if value:
            config[key] = value
    config["timeout"] = args.timeout
    config["useragent"] = "hivemind-chat-cli"
    if not args.no_store:
        from hivemind_chat_agent.client.session_store import default_store_dir
        config["session_store"] = default_store_dir()
    return config


def _password(args, out) -> Optional[str]:
    """The hub password: --password ('-' asks), else --password-file, else the environment;
    None leaves it to the HiveMind identity."""
    if args.password == "-":
        return getpass.getpass("HiveMind password: ")
    if args.password is not None:
        if out is not None:
            out.info("note: --password shows in the process list; --password -, "
                     f"--password-file or {PASSWORD_ENV} keep it out")
        return args.password
    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n")
        except OSError as e:
            raise ConfigurationError(f"cannot read the password file {args.password_file}: "
                                     f"{e.strerror or e}") from None
    return os.environ.get(PASSWORD_ENV) or None
