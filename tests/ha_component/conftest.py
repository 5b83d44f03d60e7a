"""Fixtures of the integration's tests under Home Assistant's own test harness
(pytest-homeassistant-custom-component: its `hass`, MockConfigEntry, async_fire_time_changed),
run inside the Home Assistant chroot by tests/test_home_assistant_harness.py, never on the host
(tests/conftest.py's collect_ignore keeps the host's pytest out of this folder).

The hub is a genuine hivemind-core the host-side test started on 127.0.0.1: its port and a
client's access key and password come in HIVEMIND_TEST_HUB_PORT, _KEY and _PASSWORD (the host
redacts them from what it reports; short tracebacks show no fixture values). Sockets are
enabled (the harness blocks them unless asked; its allow-list, 127.0.0.1, stays), custom
integrations are loaded (custom_components/ beside this folder), and HA's core integration is
set up.
"""
import asyncio
import os
import threading
import time
from typing import Any, Dict

import pytest
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

# ours imported first, so `custom_components` is this checkout's: HA's loader imports that
# name, and the harness puts its own testing_config (a custom_components of its own) on sys.path
import custom_components.hivemind_chat  # noqa: E402, F401
from hivemind_chat_agent.bridges.ha_native import DOMAIN


@pytest.fixture(scope="session", autouse=True)
def _process_threads():
    """The package's process-wide threads, not any agent's: the launcher (background.
    start_soon), started here before any test so the harness's check that a test left no
    thread behind (verify_cleanup) does not count it, and the shared workers
    (background._async_workers), which idle 30 s before they leave by design, here 0.2 s.
    What the check sees then is the agent's own threads."""
    from hivemind_chat_agent import background
    background._async_workers._idle_timeout = 0.2
    background.start_soon(threading.Thread(target=lambda: None, name="hivemind-chat-warm"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
            t.name == "hivemind-chat-launcher" for t in threading.enumerate()):
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def _threads_ended():
    """After each test (and its entry's unload): up to 5 s for the threads it started to end
    (a cancelled timer, an idle worker leave a moment later); what is still running then is
    left behind, and the harness's verify_cleanup fails the test naming it."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
            t.is_alive() and not isinstance(t, threading._DummyThread)
            for t in set(threading.enumerate()) - before):
        time.sleep(0.05)


@pytest.fixture(autouse=True)
async def _harness(hass: HomeAssistant, enable_custom_integrations, socket_enabled):
    """Every test: our integration loadable, 127.0.0.1 reachable, and HA's core integration
    set up (conversation, our dependency, needs its exposed entities: a running hass has it)."""
    assert await async_setup_component(hass, "homeassistant", {})


@pytest.fixture
def hub_data() -> Dict[str, Any]:
    """The entry data of the host's hub (a KeyError names what the host did not pass)."""
    return {"host": "127.0.0.1", "port": int(os.environ["HIVEMIND_TEST_HUB_PORT"]),
            "access_key": os.environ["HIVEMIND_TEST_HUB_KEY"],
            "password": os.environ["HIVEMIND_TEST_HUB_PASSWORD"]}


@pytest.fixture
async def loaded_entry(hass: HomeAssistant, hub_data):
    """A set-up entry of the hub (through HA's config entries, as a restart loads one); it is
    unloaded afterwards if the test did not (its agent's threads must end: the harness fails a
    test that leaves threads behind)."""
    entry = MockConfigEntry(domain=DOMAIN, data=hub_data, title="OVOS hub",
                            unique_id=f"127.0.0.1:{hub_data['port']}")
    entry.add_to_hass(hass)
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    yield entry
    if entry.state is ConfigEntryState.LOADED:
        await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


def entity_of(hass: HomeAssistant, entry) -> str:
    """The entry's conversation entity."""
    entity_id = er.async_get(hass).async_get_entity_id("conversation", DOMAIN, entry.entry_id)
    assert entity_id is not None
    return entity_id


async def until(condition, timeout: float = 10):
    """`condition()`'s first true value, polled on the loop; AssertionError after `timeout`
    s. For what a turn starts off the loop and nobody awaits (the subscribing: HA's
    async_block_till_done does not wait for executor jobs)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {timeout} s"
        await asyncio.sleep(0.02)
    return value
