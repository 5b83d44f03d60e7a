"""The integration's tests under Home Assistant's own test harness (conftest.py says how)."""
