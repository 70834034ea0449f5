"""Server settings: command-line flags over the environment over a TOML file over defaults.

Every setting is listed once, with its variable, file key, flag and default, in
``docs/configuration.md`` (a test holds that page and :class:`Settings` together). The
environment names a setting ``LAKESHORE_`` + its field name, in any case; the spec's
``ELASTICITY_*`` names are read too, under the ``LAKESHORE_`` ones. The file (``--config``
or ``LAKESHORE_CONFIG``) is read by pydantic-settings' own TOML source, its keys the field
names; a key it does not know is refused, so a typo is never silently ignored.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from lakeshore.defaults import (
    ADMIN_TOKEN_FILE,
    ADMIN_TOKEN_MIN_CHARS,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_URL,
    default_data_dir,
    read_local_admin_token,
)
from lakeshore.domain.retention import MAX_RETENTION_S

__all__ = [
    "ADMIN_TOKEN_FILE",
    "CONFIG_ENV",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_URL",
    "ENV_PREFIX",
    "SPEC_NAMES",
    "ConfigFile",
    "ConfigFileError",
    "Settings",
    "default_data_dir",
    "read_local_admin_token",
]

ENV_PREFIX = "LAKESHORE_"
CONFIG_ENV = "LAKESHORE_CONFIG"
# the spec's names, read when the LAKESHORE_ one is not set
SPEC_NAMES: Mapping[str, str] = {
    "ELASTICITY_ENABLED": "elasticity_enabled",
    "ELASTICITY_INTERVAL_S": "elasticity_interval_s",
    "ELASTICITY_CALL_TIMEOUT_S": "elasticity_call_timeout_s",
    "ELASTICITY_NOOP_RETENTION_S": "elasticity_noop_retention_s",
}


class ConfigFileError(Exception):
    """The configuration file is missing, not TOML, or holds a key no setting has."""


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    named_by: str  # "--config" or "LAKESHORE_CONFIG": what the user wrote it in


_chosen: ContextVar[ConfigFile | None] = ContextVar("lakeshore_config_file", default=None)


def config_file() -> ConfigFile | None:
    """The file :meth:`Settings.load` was given, else the one ``LAKESHORE_CONFIG`` names."""
    chosen = _chosen.get()
    if chosen is not None:
        return chosen
    named = os.environ.get(CONFIG_ENV)
    return ConfigFile(Path(named).expanduser(), CONFIG_ENV) if named else None


class _ServerFile(TomlConfigSettingsSource):
    """pydantic-settings' TOML source, refusing a missing file and keys no setting has."""

    def __init__(self, settings_cls: type[BaseSettings], chosen: ConfigFile) -> None:
        if not chosen.path.is_file():
            raise ConfigFileError(f"{chosen.named_by}: no such file: {chosen.path}")
        try:
            super().__init__(settings_cls, toml_file=chosen.path)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"{chosen.path}: not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:  # binary, UTF-16, Latin-1 ...: TOML is UTF-8
            raise ConfigFileError(
                f"{chosen.path}: not a TOML file: byte {exc.start} is not UTF-8 "
                "(TOML files are UTF-8 text)"
            ) from None
        except RecursionError:  # tomllib parses nested arrays and tables by recursion
            raise ConfigFileError(
                f"{chosen.path}: not valid TOML: arrays or tables nested too deeply to read"
            ) from None
        except OSError as exc:
            raise ConfigFileError(f"{chosen.path}: cannot read it: {exc.strerror}") from None
        known = list(settings_cls.model_fields)
        for key in self.toml_data:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigFileError(f"{chosen.path}: unknown key {key!r}{hint}")


class _SpecNames(PydanticBaseSettingsSource):
    """The spec's ``ELASTICITY_*`` variables, by their field names (any case, as the
    ``LAKESHORE_`` ones)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # all the work is in __call__

    def __call__(self) -> dict[str, Any]:
        upper = {key.upper(): value for key, value in os.environ.items()}
        return {field: upper[name] for name, field in SPEC_NAMES.items() if name in upper}


LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]

# The floors of the loops' periods: a period of a nanosecond is accepted by a float, and
# an idle server then spins its core on sweeps and ticks. A tenth of a second is ten
# sweeps (or ticks) a second, each a statement or two; a lease of a second is a heartbeat
# every third of one.
MIN_INTERVAL_S = 0.1
MIN_LEASE_S = 1.0


class Settings(BaseSettings):
    """The server's settings; docs/configuration.md says what each one does."""

    # no inf or nan: a period of inf or nan breaks the loop that sleeps it
    model_config = SettingsConfigDict(extra="forbid", env_prefix=ENV_PREFIX, allow_inf_nan=False)

    host: str = Field(default=DEFAULT_HOST, min_length=1)
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    admin_token: str | None = None
    public_url: str | None = None
    node_id: str | None = None
    log_format: Literal["text", "json"] = "text"
    log_level: LogLevel = "info"
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    max_payload_bytes: int = Field(default=256 << 10, gt=0)
    max_result_bytes: int = Field(default=512 << 10, gt=0)
    lease_s: float = Field(default=30.0, ge=MIN_LEASE_S, le=3600)
    reaper_interval_s: float = Field(default=1.0, ge=0)  # 0, or at least MIN_INTERVAL_S
    claim_recheck_s: float = Field(default=5.0, ge=MIN_INTERVAL_S)
    elasticity_enabled: bool = True
    elasticity_interval_s: float = Field(default=5.0, ge=MIN_INTERVAL_S)
    elasticity_call_timeout_s: float = Field(default=10.0, gt=0, le=600)
    elasticity_noop_retention_s: float = Field(default=86_400.0, gt=0)
    # finished invocations and decision events are deleted after these (docs/taskqueue.md)
    retention_s: float = Field(default=604_800.0, gt=0, le=MAX_RETENTION_S)
    event_retention_s: float = Field(default=604_800.0, gt=0, le=MAX_RETENTION_S)
    retention_interval_s: float = Field(default=60.0, ge=0)  # 0, or at least MIN_INTERVAL_S
    allowed_scalers: str = ""
    metrics_public: bool = False
    forwarded_allow_ips: str = "127.0.0.1,::1"
    header_timeout_s: float = Field(default=10.0, ge=MIN_INTERVAL_S, le=3600)
    body_timeout_s: float = Field(default=60.0, ge=MIN_INTERVAL_S, le=3600)
    max_connections: int | None = Field(default=None, ge=1)  # None: from the fd limit

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init values) > ``LAKESHORE_*`` > ``ELASTICITY_*`` > the file."""
        sources = [init_settings, env_settings, _SpecNames(settings_cls)]
        chosen = config_file()
        if chosen is not None:
            sources.append(_ServerFile(settings_cls, chosen))
        return tuple(sources)

    @classmethod
    def load(cls, config: Path | None = None, **flags: Any) -> Settings:
        """The settings with ``flags`` (the ones given) over the rest; ``config`` is the
        file ``--config`` names (else ``LAKESHORE_CONFIG``'s)."""
        with _choosing(ConfigFile(config, "--config") if config else None):
            return cls(**flags)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("reaper_interval_s", "retention_interval_s", mode="wrap")
    @classmethod
    def _never_or_a_floor(cls, value: object, handler: ValidatorFunctionWrapHandler) -> float:
        """``0`` turns the loop off; any other period has the loops' floor."""
        period: float = handler(value)
        if 0 < period < MIN_INTERVAL_S:
            raise ValueError(
                f"expected 0 (never) or a number at least {MIN_INTERVAL_S}, got {value!r}"
            )
        return period

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: str) -> str:
        """Addresses and networks (``10.0.0.0/8``), or ``*``: a host name would never match
        the peer's address uvicorn compares it with, so it is refused, not ignored."""
        for item in _items(value):
            if item == "*":
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(
                    f"expected addresses or networks (10.0.0.0/8), comma-separated, or *; "
                    f"{item!r} is neither"
                ) from None
        return ",".join(_items(value))

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
                f"{ADMIN_TOKEN_MIN_CHARS} (or leave it unset to have one generated)"
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


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


@contextmanager
def _choosing(chosen: ConfigFile | None) -> Iterator[None]:
    token = _chosen.set(chosen)
    try:
        yield
    finally:
        _chosen.reset(token)
