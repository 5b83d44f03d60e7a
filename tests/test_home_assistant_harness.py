"""The integration's tests under Home Assistant's own test harness
(pytest-homeassistant-custom-component, tests/ha_component/), run inside the genuine HA
2026.11 chroot with its Python 3.14 and pytest (ha_harness.py), against a genuine hivemind-core
hub of each generation started here on 127.0.0.1: its port and a client's credentials go in
through the environment, never onto a command line or into a log.

What they cover, where a running hass makes it hard: HA forgetting a conversation after
chat_session's 5-minute timeout (a time jump) releases its session's speech subscription, the
ask action's sessions outlive it, unloading closes every subscription and shuts the agent down;
and, small, the config flow's errors, reauth and options through the flow manager.

One host test per generation runs them all; a failure is reported with each inner test's id
and message (InnerRun.report). Skipped, saying why, only where the HA runtime cannot be built.
"""
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ha_harness  # noqa: E402
from test_home_assistant_native import ha_root  # noqa: E402, F401  (the fixture)

pytestmark = pytest.mark.hub

INNER_TESTS = 6      # tests/ha_component's tests: all of them must have run and passed


def test_the_integrations_tests_pass_under_home_assistants_test_harness(ha_root,  # noqa: F811
                                                                         hub):
    creds = hub.add_client()
    began = time.monotonic()
    run = ha_harness.run_component_tests(ha_root, {
        "HIVEMIND_TEST_HUB_PORT": str(hub.port), "HIVEMIND_TEST_HUB_KEY": creds.key,
        "HIVEMIND_TEST_HUB_PASSWORD": creds.password})
    print(f"\nthe harness's {len(run.outcomes)} tests ran in {time.monotonic() - began:.1f} s",
          file=sys.stderr)
    assert run.returncode == 0 and not run.failures, run.report()
    assert len(run.outcomes) == INNER_TESTS and set(run.outcomes.values()) == {"passed"}, \
        run.report()
