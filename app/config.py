"""Settings: environment variables ``TXLOG_*`` (a command-line flag of the same name wins)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TXLOG_", extra="ignore")

    database_url: str | None = None
    data_dir: Path = Path(".txlog")
    max_transaction_timeout_ms: int = Field(900_000, gt=0)  # transaction.max.timeout.ms
    default_transaction_timeout_ms: int = Field(60_000, gt=0)  # transaction.timeout.ms
    transaction_abort_check_interval_ms: int = Field(10_000, gt=0)
    transactional_id_expiration_ms: int = Field(604_800_000, gt=0)
    producer_id_expiration_ms: int = Field(86_400_000, gt=0)
    transaction_state_partitions: int = Field(50, gt=0)  # transaction.state.log.num.partitions
    max_request_bytes: int = Field(1_048_576, gt=0)  # message.max.bytes
    db_pool_size: int = Field(10, gt=0)
    admin_token: str | None = None

    @field_validator("database_url")
    @classmethod
    def _empty_is_none(cls, v: str | None) -> str | None:
        return v or None


def load_settings(**overrides: object) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
