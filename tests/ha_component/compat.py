"""What the harness of pytest-homeassistant-custom-component 0.13.375 (extracted from HA
2026.10.4's tests/, the newest release: none for 2026.11.0 yet) expects of HA that 2026.11.0
moved, put back before the harness's plugin is imported (ha_harness.LAUNCHER imports this
first). Each is a name the harness imports, pointed at where 2026.11.0 keeps the same thing;
none changes what HA does. Importing homeassistant here also comes first for a reason of its
own: 2026.11.0 aliases its httpx2 as `httpx` on import, and refuses once httpx is imported
(the harness's plugin imports respx, which imports httpx, before homeassistant).
"""
import homeassistant  # noqa: F401  (first: the httpx2 alias)
from homeassistant.components import logger
from homeassistant.components.logger import helpers as logger_helpers

# 2026.11.0: components/logger/helpers.py (2026.10: components/logger/__init__.py)
if not hasattr(logger, "_clear_logger_overwrites"):
    logger._clear_logger_overwrites = logger_helpers._clear_logger_overwrites  # type: ignore
