import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

# Each range is the widest the code supports as far as it is known; a floor on a pre-release is
# there because the feature beside it exists only in pre-releases. The exact set the test suite
# runs against is constraints.txt (`pip install -c constraints.txt ...`); see
# docs/configuration.md#dependencies.
CLIENT = [
    # the Noise (v3) primitives 5.x hubs need and the password handshake of 4.x hubs; no stable
    # release has Noise, and 1.2.12a1 is the oldest the suite runs (it also takes bitstring 5)
    "hivemind-bus-client>=1.2.12a1,<2",
    "poorman-handshake>=2.0.2a1,<3",      # derive_psk: the Noise PSK from the password (argon2id)
    # Session and SessionManager: 1.x beside a stable ovos-core 2.x, 2.x beside hivemind-core 5
    "ovos-bus-client>=1.3.1,<3",
    # the ChatEngine template and the opm.agents.chat group exist from 2.4.0a1 on (2.2.0, the
    # stable release ovos-core 2.1.1 ships, has neither); 3.x keeps both (its template is
    # byte-identical to 2.12.5a1's) and 3.1.0a1 is tested (the opm3-client venv of
    # tests/hub_venvs.py). The hub role cannot follow yet: hivemind-core 5.3.10a1 caps it <3
    "ovos-plugin-manager>=2.4.0a1,<4",
    "ovos-utils>=0.3.0,<1",               # LOG and the XDG paths
    "websocket-client>=1.2,<2",           # the hub connection (ABNF frames, recv_length)
    "pybase64>=1.0",                      # the access key's Basic authorization header
]
# The hub's role: ChatAgentProtocol inside hivemind-core 5.x (the line with Noise). A 4.0.0
# hub pins poorman-handshake<2, so there the plugin goes in with --no-deps
# (docs/compatibility.md#on-a-40-hub).
HUB = ["hivemind-core>=5.0.0a1,<6"]
EXTRAS = {
    "hub": HUB,
    # `hivemind-chat demo`: the embedded hub (hivemind-core brings tornado and the websocket
    # protocol) and the offline ALICE chatbot it answers with
    "demo": HUB + ["aiml>=0.9.2,<1"],
    # `hivemind-chat wyoming`: HandledStart/Chunk/Stop (--stream) exist from 1.7.0 on
    "wyoming": ["wyoming>=1.7.0,<2"],
    # `hivemind-chat wyoming --zeroconf`: Home Assistant discovers the service
    "zeroconf": ["wyoming>=1.7.0,<2", "zeroconf>=0.88.0,<1", "ifaddr>=0.2.0"],
    # `hivemind-chat openai`: the OpenAI chat API (Starlette routes served by uvicorn, the
    # ASGI pair Open WebUI and most OpenAI-compatible servers run on)
    "openai": ["starlette>=0.37,<2", "uvicorn>=0.27,<1"],
    # `hivemind-chat mcp`: the official Model Context Protocol SDK (2.x: MCPServer, stdio and
    # streamable HTTP)
    "mcp": ["mcp>=2.0,<3"],
    # `hivemind-chat a2a`: the official Agent2Agent SDK's server (JSON-RPC routes with the 0.3
    # names beside 1.0's, DefaultRequestHandler v2, Starlette and sse-starlette through its
    # http-server extra) served by uvicorn; 1.3.0 is the release the suite runs
    "a2a": ["a2a-sdk[http-server]>=1.3.0,<2", "uvicorn>=0.27,<1"],
    # the Redis conversation store (hub replicas, docs/scale-out.md): the `redis` client and
    # its connection pool; 5.0 is the oldest line upstream still maintains, the suite runs 7.4;
    # with redis-py's own `hiredis` extra (its C packer and parser, as hivemind-redis-database
    # has it): the store's CPU per turn 150-240 us without, 106-193 us with (docs/performance.md)
    "redis": ["redis[hiredis]>=5.0,<9"],
    # the hub plugin's "health" endpoint: /metrics through the official Prometheus client
    # (a CollectorRegistry per plugin, choose_encoder, Gauge.set_function: all in 0.17, the
    # oldest release the range lets in; the suite runs 0.26.0). No dependencies of its own
    "metrics": ["prometheus-client>=0.17,<1"],
    # `host: "mqtt://BROKER"`: the client through an MQTT broker (hivemind-mqtt-protocol's
    # topics). paho-mqtt: Eclipse's maintained client, the one the hub's MQTT plugin runs on,
    # with a plain socket loop that fits the client's one-reading-thread-per-connection model;
    # 2.0 brought the callback API version 2 used here
    "mqtt": ["paho-mqtt>=2.0,<3"],
    # benchmarks/bench_hub.py: the stock HiveMind -> OVOS path it measures our plugin against
    # the checks .ci/check and .ci/run make before the tests: lint and import order (ruff.toml),
    # types (mypy.ini)
    "lint": ["ruff>=0.6,<1", "mypy>=1.11"],
    "bench": ["hivemind-ovos-agent-plugin>=0.4.0a1,<1", "ovos-messagebus>=0.2.0a1",
              "py-spy>=0.3"],
}
EXTRAS["test"] = sorted(set(EXTRAS["hub"] + EXTRAS["demo"] + EXTRAS["wyoming"] +
                            EXTRAS["redis"] + EXTRAS["openai"] + EXTRAS["mcp"] +
                            EXTRAS["a2a"] + EXTRAS["metrics"] + EXTRAS["mqtt"]) | {
    "pytest>=8", "pexpect>=4.8", "ovos-persona>=0.9.0a1",
    "openai>=1.40"})     # the official client, as Open WebUI-style callers use the API

setup(
    name="hivemind-chat-agent",
    version="0.1.0",
    description="Chat with a remote OVOS hub over HiveMind as an OPM ChatEngine, and serve "
                "HiveMind satellites with any chat engine",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["hivemind_chat_agent", "hivemind_chat_agent.*"]),
    package_data={"hivemind_chat_agent.bridges": ["data/*.aiml"]},
    # hivemind-bus-client (every release with Noise) and ovos-plugin-manager need 3.10
    python_requires=">=3.10",
    install_requires=CLIENT,
    extras_require=EXTRAS,
    entry_points={
        "opm.agents.chat": [
            "hivemind-chat-agent=hivemind_chat_agent.client.agent:HiveMindChatAgent",
            "hivemind-chat-demo-aiml=hivemind_chat_agent.bridges.demo_engine:AIMLChatEngine",
        ],
        "console_scripts": [
            "hivemind-chat=hivemind_chat_agent.bridges.cli:main",
        ],
        "hivemind.agent.protocol": [
            "hivemind-chat-agent-plugin=hivemind_chat_agent.hub.plugin:agent_protocol",
        ],
    },
    classifiers=["Programming Language :: Python :: 3",    # license: the SPDX field above
                 "Programming Language :: Python :: 3.10",
                 "Programming Language :: Python :: 3.13"],
)
