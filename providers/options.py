"""A provider's own settings and a catalog entry's options, the models every provider extends."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProviderSettings(BaseSettings):
    """A provider's own settings. Subclasses set `model_config = SettingsConfigDict(
    env_prefix="CONTROLPLANE_<NAME>_")`, so every field is an environment variable."""

    model_config = SettingsConfigDict(extra="ignore")


class ProviderOptions(BaseModel):
    """A catalog entry's `provider_options`, validated at catalog load. Unknown keys are errors.
    Validators may read the entry's resources from `info.context` (`cpu`, `memory_mb`, `gpu`,
    `scratch_mb`), e.g. to refuse a shape the runner cannot give."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class WaitPolicy(ProviderOptions):
    """Options of a runner whose jobs may wait for capacity, perhaps for ever: past
    `stuck_after_s` (default: the provider's setting) a waiting job is reported with its reason,
    and with `on_stuck = "fail"` given up on (stopped, the attempt LAUNCH_FAILED)."""

    stuck_after_s: float | None = Field(default=None, gt=0)
    on_stuck: Literal["wait", "fail"] = "wait"


def waiting_verdict(status: str, waited_s: float, why: str, *, stuck_after_s: float, on_stuck: str,
                    noun: str = "job") -> tuple[str | None, str | None]:
    """(waiting_reason, give_up_reason) of a job that has been waiting `waited_s` in `status`."""
    if waited_s <= stuck_after_s:
        return None, None
    waiting = f"{status} for {waited_s / 60:.0f} min: {why}"
    return waiting, (f"the {noun} did not start: {waiting}" if on_stuck == "fail" else None)
