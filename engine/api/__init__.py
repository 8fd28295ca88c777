"""OpenAI-compatible local HTTP API on the running Engine (no Qt here)."""
from .errors import ApiConfigError, ApiError
from .server import ApiActivity, ApiServer, check_bind, is_loopback

__all__ = ["ApiActivity", "ApiConfigError", "ApiError", "ApiServer", "check_bind", "is_loopback"]
