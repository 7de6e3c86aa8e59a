"""Cloud Run's settings and a catalog entry's options (the job a resource class runs on)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from controlplane_providers.options import ProviderSettings, WaitPolicy


class CloudRunSettings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_CLOUD_RUN_", extra="ignore")

    endpoint: str | None = None  # Cloud Run Admin API base URL (default run.googleapis.com)
    logging_endpoint: str | None = None  # Cloud Logging API base URL (default logging.googleapis.com)
    credentials_file: Path | None = None  # a service-account key; default: Application Default Credentials
    anonymous: bool = False  # send no credentials (emulators and fakes only)
    max_tps: float = Field(default=10.0, gt=0)  # Admin API requests per second, per project and region
    log_reads_per_min: int = Field(default=60, ge=1)  # Cloud Logging entries.list, per project
    poll_interval_s: float = Field(default=10.0, gt=0)
    page_size: int = Field(default=500, ge=1, le=1000)  # executions per ListExecutions page
    stuck_after_s: float = Field(default=900.0, gt=0)
    retry_deadline_s: float = Field(default=30.0, ge=0)  # how long one call retries 429/5xx
    list_lag_s: float = Field(default=60.0, ge=0)  # after an ambiguous RunJob, how long `find` keeps looking


class CloudRunOptions(WaitPolicy):
    job: str = Field(min_length=1)
    project: str | None = None
    region: str | None = None
    container: str | None = None

    @model_validator(mode="after")
    def _located(self) -> CloudRunOptions:
        if self.job.startswith("projects/"):
            parts = self.job.split("/")
            if len(parts) != 6 or parts[2] != "locations" or parts[4] != "jobs" or not all(parts[1::2]):
                raise ValueError("job: a full name is projects/PROJECT/locations/REGION/jobs/JOB")
        elif "/" in self.job:
            raise ValueError("job: a job name, or projects/PROJECT/locations/REGION/jobs/JOB")
        elif not (self.project and self.region):
            raise ValueError("project: project and region are required with a short job name")
        return self

    @property
    def job_path(self) -> str:
        return self.job if self.job.startswith("projects/") else \
            f"projects/{self.project}/locations/{self.region}/jobs/{self.job}"


def job_parts(job_path: str) -> tuple[str, str, str]:
    """(project, region, job) of projects/P/locations/R/jobs/J."""
    _, project, _, region, _, job = job_path.split("/")
    return project, region, job
