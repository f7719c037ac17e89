"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

Handlers raise `APIError`; the ingress turns it into a JSON response (or, once a stream
has started, an SSE error event). Status codes: 400 bad input, 401 bad API key, 404
unknown model or route, 413 prompt or body too long, 503 not ready or overloaded.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class APIError(Exception):
    status_code: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def unauthorized() -> APIError:
    return APIError(401, "Incorrect API key provided: pass it as 'Authorization: Bearer <key>'.",
                    "authentication_error", None, "invalid_api_key")


def model_not_found(model: str, served: str) -> APIError:
    return APIError(404, f"The model '{model}' does not exist; this server serves '{served}'.",
                    "invalid_request_error", "model", "model_not_found")


def too_large(message: str, param: str | None = None, code: str = "context_length_exceeded") -> APIError:
    return APIError(413, message, "invalid_request_error", param, code)


def unavailable(message: str, code: str = "service_unavailable") -> APIError:
    return APIError(503, message, "service_unavailable_error", None, code)


def internal(message: str) -> APIError:
    return APIError(500, message, "server_error", None, "internal_error")


@dataclass
class GenerateError:
    """A replica's refusal, sent as the first item of its stream instead of raising (so the
    ingress does not have to unwrap Ray exceptions): status, message, param, code."""

    status_code: int
    message: str
    param: str | None = None
    code: str | None = None

    def to_api_error(self) -> APIError:
        if self.status_code == 503:
            return unavailable(self.message, self.code or "overloaded")
        if self.status_code == 413:
            return too_large(self.message, self.param, self.code or "context_length_exceeded")
        return APIError(self.status_code, self.message, "invalid_request_error", self.param, self.code)
