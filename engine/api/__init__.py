"""OpenAI-compatible local HTTP API on the running Engine (no Qt here)."""
from .access import check_bind, is_loopback
from .activity import ApiActivity
from .errors import ApiConfigError, ApiError
from .server import ApiServer

__all__ = ["ApiActivity", "ApiConfigError", "ApiError", "ApiServer", "check_bind", "is_loopback"]
