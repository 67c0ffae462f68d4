"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

Every problem a request can cause ends as an ``ApiError``; the server turns it into a response
(or, once a stream has started, into an error event). Messages say what to change, never carry a
stack trace.
"""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.retry_after = retry_after  # seconds, sent as Retry-After

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_TYPES = {401: "invalid_request_error", 404: "invalid_request_error", 413: "invalid_request_error",
          500: "server_error", 503: "server_error"}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400: a field the server cannot honour; ``param`` names it."""
    return ApiError(400, message, param, code)
