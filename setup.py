import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def requirements(name):
    with open(os.path.join(HERE, name)) as f:
        return [line.split("#")[0].strip() for line in f
                if line.split("#")[0].strip() and not line.startswith("-")]


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
    python_requires=">=3.9",
    install_requires=requirements("requirements.txt"),
    extras_require={"test": requirements("requirements-test.txt"),
                    "bench": requirements("requirements-bench.txt"),
                    # `hivemind-chat wyoming --zeroconf`: Home Assistant discovers the service
                    "zeroconf": ["zeroconf==0.154.0", "ifaddr==0.2.0"]},
    entry_points={
        "opm.agents.chat": [
            "hivemind-chat-agent=hivemind_chat_agent.client.agent:HiveMindChatAgent",
            "hivemind-chat-demo-aiml=hivemind_chat_agent.bridges.demo_engine:AIMLChatEngine",
        ],
        "console_scripts": [
            "hivemind-chat=hivemind_chat_agent.bridges.cli:main",
        ],
        "hivemind.agent.protocol": [
            "hivemind-chat-agent-plugin=hivemind_chat_agent.hub.protocol:ChatAgentProtocol",
        ],
    },
    classifiers=["Programming Language :: Python :: 3"],   # license: the SPDX field above
)
