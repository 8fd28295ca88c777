"""The window's line to an engine: the bridge (the one place engine events become Qt signals),
the switch between the built-in engine and a remote server, and the in-app API server's control.
May import: settings, memory and the root modules."""

from .api_control import ApiControl
from .bridge import EngineBridge
from .engine_switch import EngineSwitch

__all__ = ["ApiControl", "EngineBridge", "EngineSwitch"]
