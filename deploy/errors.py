"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

Handlers raise `APIError`; the ingress turns it into a JSON response (or, once a stream
has started, an SSE error event). Status codes: 400 bad input, 401 bad API key, 404
unknown model or route, 413 body too large, 429 over a per-key limit, 503 not ready or overloaded
(both with Retry-After). Context-length overflows are 400, as OpenAI and vLLM answer.
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
    retry_after_s: int | None = None  # sent as Retry-After (overload: when a retry may succeed)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None


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


DEFAULT_RETRY_AFTER_S = 1


def unavailable(message: str, code: str = "service_unavailable", retry_after_s: int | None = None) -> APIError:
    """503: not ready, overloaded, or the replica failed; always with a Retry-After."""
    return APIError(503, message, "service_unavailable_error", None, code, retry_after_s or DEFAULT_RETRY_AFTER_S)


def retry_after_from(seconds: float | None) -> int:
    """A Retry-After value (whole seconds, 1..60) from an estimate of the wait."""
    if seconds is None or seconds != seconds:
        return DEFAULT_RETRY_AFTER_S
    return max(1, min(60, int(seconds + 0.999)))


REPLICA_FAILED = "replica_failed"
ENGINE_DEAD = "engine_dead"  # a replica whose engine died: it can serve nothing more until Serve replaces it
OVERLOADED = "overloaded"
REPLICA_FAILURES = (REPLICA_FAILED, ENGINE_DEAD)  # retried on another replica while the request has no token


def replica_failed(message: str) -> APIError:
    """The replica serving a request died or became unreachable mid-request (the serving
    layer retries on another replica while the request has produced no token yet)."""
    return APIError(503, message, "service_unavailable_error", None, REPLICA_FAILED, DEFAULT_RETRY_AFTER_S)


def internal(message: str) -> APIError:
    return APIError(500, message, "server_error", None, "internal_error")


@dataclass
class GenerateError:
    """A replica's refusal, sent as the first item of its stream instead of raising (so the
    ingress does not have to unwrap Ray exceptions): status, message, param, code, and the
    replica that refused (set on a replica's own overload refusals: the ingress tries another)."""

    status_code: int
    message: str
    param: str | None = None
    code: str | None = None
    retry_after_s: int | None = None
    replica: str | None = None

    def to_api_error(self) -> APIError:
        if self.status_code == 503:
            return unavailable(self.message, self.code or OVERLOADED, self.retry_after_s)
        if self.status_code == 413:
            return too_large(self.message, self.param, self.code or "context_length_exceeded")
        return APIError(self.status_code, self.message, "invalid_request_error", self.param, self.code)
