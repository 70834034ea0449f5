"""Lakeshore's exception tree.

Every error Lakeshore raises on purpose derives from :class:`LakeshoreError`. Each class
carries a stable ``code`` (the machine-readable name an API client sees) and the HTTP
status the API answers with; the mapping lives here, in one place, so the service layer
never thinks in status codes and the API layer never invents them.

    LakeshoreError
    ├── InvalidInput          422  a value breaks a rule (names the field)
    ├── Unauthorized          401  no token, or a token that opens nothing
    ├── Forbidden             403  a valid token asking for what it may not do
    ├── NotFound              404  absent, or in a namespace the caller cannot see
    ├── Conflict              409  the request clashes with the record's current state
    ├── Gone                  410  a worker retired by the controller
    ├── PayloadTooLarge       413  a body over the server's cap
    ├── UnsupportedMediaType  415  a body that is not JSON
    ├── TooManyRequests       429  admission refused the request for now
    ├── ProviderFailed        502  a provider could not launch or stop a daemon
    └── StoreUnavailable      503  the database could not be reached
"""

from __future__ import annotations

import math


class LakeshoreError(Exception):
    """Root of every error Lakeshore raises on purpose."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(LakeshoreError):
    status = 422
    code = "invalid"


class Unauthorized(LakeshoreError):
    status = 401
    code = "unauthorized"


class Forbidden(LakeshoreError):
    status = 403
    code = "forbidden"


class NotFound(LakeshoreError):
    status = 404
    code = "not_found"


class Conflict(LakeshoreError):
    status = 409
    code = "conflict"


class Gone(LakeshoreError):
    status = 410
    code = "gone"


class PayloadTooLarge(LakeshoreError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(LakeshoreError):
    status = 415
    code = "unsupported_media_type"


class TooManyRequests(LakeshoreError):
    status = 429
    code = "too_many_requests"

    def __init__(
        self, message: str, *, field: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, field=field)
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        """The answer's ``Retry-After`` (whole seconds, at least 1), when there is a wait."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class ProviderFailed(LakeshoreError):
    status = 502
    code = "provider_failed"


class StoreUnavailable(LakeshoreError):
    status = 503
    code = "store_unavailable"
