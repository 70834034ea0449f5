"""Server settings, read from the environment (and overridable by ``lakeshore server`` flags).

| variable                   | default                                   |
| -------------------------- | ----------------------------------------- |
| ``LAKESHORE_DATABASE_URL`` | ``sqlite:///<data dir>/lakeshore.db``     |
| ``LAKESHORE_DATA_DIR``     | the per-user data dir (``~/.local/share/lakeshore`` on Linux) |
| ``LAKESHORE_ADMIN_TOKEN``  | generated once into ``<data dir>/admin-token`` (0600); 16+ chars |
| ``LAKESHORE_MAX_BODY_BYTES`` | ``1048576`` (larger request bodies get 413) |
| ``LAKESHORE_MAX_PAYLOAD_BYTES`` | ``262144`` (an invocation's args + kwargs as JSON; over → 413) |
| ``LAKESHORE_MAX_RESULT_BYTES`` | ``524288`` (a result or a stream item as JSON; over → 413) |
| ``LAKESHORE_NODE_ID``      | none (queues pinned to a node id are ticked only there) |
| ``LAKESHORE_LEASE_S``      | ``30`` (a claim's lease; heartbeats renew it every third of it) |
| ``LAKESHORE_REAPER_INTERVAL_S`` | ``1`` (how often expired leases are returned; 0 = never) |
| ``LAKESHORE_CLAIM_RECHECK_S`` | ``5`` (a waiting claim's fallback re-check) |
| ``ELASTICITY_ENABLED``     | ``true``                                  |
| ``ELASTICITY_INTERVAL_S``  | ``5``                                     |
| ``ELASTICITY_CALL_TIMEOUT_S`` | ``10`` (a provider or custom-scaler call) |
| ``ELASTICITY_NOOP_RETENTION_S`` | ``86400`` (no-op events older are pruned) |
| ``LAKESHORE_PUBLIC_URL``   | the address ``lakeshore server`` binds (daemons call it) |
| ``LAKESHORE_ALLOWED_SCALERS`` | none (comma-separated ``module:function`` paths) |
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from lakeshore.defaults import (
    ADMIN_TOKEN_FILE,
    ADMIN_TOKEN_MIN_CHARS,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_URL,
    default_data_dir,
    read_local_admin_token,
)

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_URL",
    "Settings",
    "default_data_dir",
    "read_local_admin_token",
]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    data_dir: Path = Field(
        default_factory=default_data_dir,
        validation_alias=AliasChoices("LAKESHORE_DATA_DIR", "data_dir"),
    )
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("LAKESHORE_DATABASE_URL", "database_url")
    )
    admin_token: str | None = Field(
        default=None, validation_alias=AliasChoices("LAKESHORE_ADMIN_TOKEN", "admin_token")
    )
    max_body_bytes: int = Field(
        default=1 << 20,
        gt=0,
        validation_alias=AliasChoices("LAKESHORE_MAX_BODY_BYTES", "max_body_bytes"),
    )
    max_payload_bytes: int = Field(
        default=256 << 10,
        gt=0,
        validation_alias=AliasChoices("LAKESHORE_MAX_PAYLOAD_BYTES", "max_payload_bytes"),
    )
    max_result_bytes: int = Field(
        default=512 << 10,
        gt=0,
        validation_alias=AliasChoices("LAKESHORE_MAX_RESULT_BYTES", "max_result_bytes"),
    )
    claim_recheck_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices("LAKESHORE_CLAIM_RECHECK_S", "claim_recheck_s"),
    )
    node_id: str | None = Field(
        default=None, validation_alias=AliasChoices("LAKESHORE_NODE_ID", "node_id")
    )
    lease_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        validation_alias=AliasChoices("LAKESHORE_LEASE_S", "lease_s"),
    )
    reaper_interval_s: float = Field(
        default=1.0,
        ge=0,
        validation_alias=AliasChoices("LAKESHORE_REAPER_INTERVAL_S", "reaper_interval_s"),
    )
    elasticity_enabled: bool = Field(
        default=True, validation_alias=AliasChoices("ELASTICITY_ENABLED", "elasticity_enabled")
    )
    elasticity_interval_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices("ELASTICITY_INTERVAL_S", "elasticity_interval_s"),
    )

    elasticity_call_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        validation_alias=AliasChoices("ELASTICITY_CALL_TIMEOUT_S", "elasticity_call_timeout_s"),
    )
    elasticity_noop_retention_s: float = Field(
        default=86_400.0,
        gt=0,
        validation_alias=AliasChoices("ELASTICITY_NOOP_RETENTION_S", "elasticity_noop_retention_s"),
    )
    public_url: str | None = Field(
        default=None, validation_alias=AliasChoices("LAKESHORE_PUBLIC_URL", "public_url")
    )
    allowed_scalers: str = Field(
        default="",
        validation_alias=AliasChoices("LAKESHORE_ALLOWED_SCALERS", "allowed_scalers"),
    )
    metrics_public: bool = Field(
        default=False,
        validation_alias=AliasChoices("LAKESHORE_METRICS_PUBLIC", "metrics_public"),
    )

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        """An empty value means unset (a token is generated); a short one is refused."""
        if not value:
            return None
        if len(value) < ADMIN_TOKEN_MIN_CHARS:
            chars = f"{len(value)} character{'s' if len(value) != 1 else ''}"
            raise ValueError(
                f"the admin token is {chars}; it needs at least "
                f"{ADMIN_TOKEN_MIN_CHARS} (or leave LAKESHORE_ADMIN_TOKEN unset to have one "
                "generated)"
            )
        return value

    @property
    def scaler_paths(self) -> list[str]:
        return [path.strip() for path in self.allowed_scalers.split(",") if path.strip()]

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'lakeshore.db'}"

    @property
    def admin_token_path(self) -> Path:
        return self.data_dir / ADMIN_TOKEN_FILE
