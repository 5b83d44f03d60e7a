"""`hivemind-chat demo`: try the whole bridge on a throw-away hub (needs the [demo] extra)."""
import os
from typing import Callable

from hivemind_chat_agent.bridges.aiml_brain import default_cache_dir
from hivemind_chat_agent.bridges.demo_engine import AIMLChatEngine
from hivemind_chat_agent.bridges.local_hub import LocalHub
from hivemind_chat_agent.client.agent import HiveMindChatAgent
from hivemind_chat_agent.hub.protocol import ChatAgentProtocol


def run_demo(args, out, run_chat: Callable[..., int]) -> int:
    """`hivemind-chat demo`: an embedded hub on 127.0.0.1 whose engine is the offline ALICE
    chatbot, a throw-away client registered on it, and the chat of `run_chat` against it.
    What takes seconds to make is made once per user and kept in the user's cache folder:
    the chatbot's learned brain and the hub's node identity."""
    out.info("Starting an embedded hivemind-core hub on 127.0.0.1 with the ALICE AIML chatbot…")
    engine = AIMLChatEngine({"bot_name": "HiveMind demo"})
    protocol = ChatAgentProtocol(config={"engine": "hivemind-chat-demo-aiml"}, engine=engine)
    hub = LocalHub(protocol, identity_dir=os.path.join(default_cache_dir(), "demo-hub")).start()
    agent = None
    try:
        creds = hub.add_client(name="hivemind-chat-demo")
        out.info(f"Hub ready at ws://{hub.host}:{hub.port}; this chat is a HiveMind satellite "
                 "with a throw-away access key and password.")
        agent = HiveMindChatAgent(creds.agent_config(timeout=args.timeout,
                                                     useragent="hivemind-chat-demo"))
        return run_chat(agent, args, out)
    finally:
        if agent is not None:
            agent.shutdown()
        protocol.shutdown()
        hub.stop()
