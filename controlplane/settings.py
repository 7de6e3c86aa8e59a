"""Settings: every tunable of the control plane, read from the environment (CONTROLPLANE_*).

Owns the home directory layout (database, object store, catalog, keys). Nothing else in the
package invents a path under the home directory: it asks a `Settings` instance.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    return absolute_home(os.environ.get("CONTROLPLANE_HOME") or Path.home() / ".controlplane")


def absolute_home(home: str | os.PathLike[str]) -> Path:
    """The home as an absolute path (`~` expanded, a relative one taken from the working
    directory now): runners start in their job's directory, and read paths derived from it."""
    return Path(home).expanduser().resolve()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    # The database URL is the only place the storage engine is named. None = SQLite under home.
    database_url: str | None = None
    catalog_path: Path | None = None
    # The catalog itself (JSON or YAML text), instead of a file: what a container is given by its
    # deployment (the Terraform modules in terraform/ set it from the catalog they made jobs for).
    catalog_json: str | None = None
    # How often a running server looks whether its catalog file changed (and loads it if so;
    # docs/design/catalog-reload.md); 0: never. A catalog given inline changes only with a restart.
    catalog_reload_s: float = Field(default=2.0, ge=0)
    # Apply the database migrations when the server starts. The container images turn this off:
    # there a one-shot `controlplane db upgrade` migrates, and a server whose database is behind
    # refuses to start instead of migrating under replicas still running the old code.
    migrate_on_start: bool = True
    # The operator's prices over the defaults (controlplane/prices.py); None = home/prices.toml, if it exists.
    prices_file: Path | None = None
    # Where task inputs, results and artifacts live, as a URL: file://, s3://, gs:// or az://.
    object_store_url: str | None = None
    # Base URL that runners call back and that artifact links point at. None = the URL the
    # server actually listens on (the HTTP transport's, or the internal listener's).
    public_url: str | None = None

    # HTTP listener for runner callbacks and artifact downloads when the MCP transport is stdio.
    internal_host: str = "127.0.0.1"
    internal_port: int = 0

    # Identity used for callers that present no credentials (stdio, loopback HTTP without auth).
    # (an identity is at most 200 characters of printable text: the store's owner column)
    default_owner: str = Field(default="local", min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    # File of bearer tokens: lines "token identity" or TOML table [tokens]; see auth.py.
    auth_tokens_file: Path | None = None
    # Inline tokens "tok1=alice,tok2=bob" (handy for tests and containers).
    auth_tokens: str | None = None

    # OAuth 2.1 resource server (controlplane/mcp/oauth.py): access tokens from the operator's
    # identity provider. On when an issuer is set; the owner of a task is then the token's
    # issuer and subject ("<issuer>#<sub>"). Comma-separated values are lists.
    auth_issuer: str | None = None
    # Other spellings of the same issuer that tokens may carry (Google: "accounts.google.com");
    # owners are always written with `auth_issuer`.
    auth_issuer_aliases: str = ""
    # The issuer's keys. None: read from its OpenID discovery document at startup.
    auth_jwks_uri: str | None = None
    # The audience tokens must name (RFC 8707). None: this server's MCP endpoint URL.
    auth_audience: str | None = None
    # Further audiences accepted (Entra ID v2 and Google put the client id in `aud`).
    auth_extra_audiences: str = ""
    # The claim holding the audience: "aud", or "client_id" for Cognito access tokens (no `aud`).
    auth_audience_claim: str = "aud"
    # With a JWKS, each key's algorithms are accepted (controlplane/mcp/jwks.py) and this is not
    # read. A symmetric one (HS256, ...) is the one accepted, with `auth_hs_secret` and no JWKS.
    auth_algorithm: str = "RS256"
    auth_hs_secret: str | None = None
    # Clock skew allowed on `nbf` (a token is refused from the second `exp` passes).
    auth_leeway_s: float = Field(default=60.0, ge=0)
    # Least seconds between two fetches of the JWKS (a token naming an unknown key triggers one).
    auth_jwks_refresh_s: float = Field(default=30.0, ge=0)
    # A JWT once verified is trusted again for this long (never past its exp) without checking its
    # signature; so a key withdrawn from the JWKS still admits tokens verified this recently. 0: off.
    auth_verified_cache_s: float = Field(default=60.0, ge=0)
    # Opaque tokens: RFC 7662 introspection at this endpoint with these client credentials.
    auth_introspection_url: str | None = None
    auth_introspection_client_id: str | None = None
    auth_introspection_client_secret: str | None = None
    # Seconds an introspection answer is reused (0: ask for every request).
    auth_introspection_cache_s: int = Field(default=0, ge=0)
    # Scope names, as they appear in tokens.
    auth_scope_submit: str = "tasks:submit"
    auth_scope_read: str = "tasks:read"
    auth_scope_cancel: str = "tasks:cancel"
    auth_scope_admin: str = "tasks:admin"
    # Put before each scope name where clients are told what to ask for (metadata, challenges):
    # Entra ID wants "api://<client id>/" there and writes the bare name in the token.
    auth_scope_request_prefix: str = ""
    # Scopes every verified token has on top of its own (for tokens without scopes: Google ID tokens).
    auth_implicit_scopes: str = ""
    # Claims a token must carry with these values ("hd=example.com,tid=<tenant>").
    auth_required_claims: str = ""
    # A claim naming the caller's team(s): members read (not cancel) each other's tasks.
    auth_team_claim: str | None = None
    # Authorization servers named in the protected resource metadata (default: the issuer).
    auth_authorization_servers: str = ""

    # Limits per caller (controlplane/limits.py), off unless set; `controlplane limits` sets
    # overrides per caller in the database, read again every `limits_refresh_s`.
    limit_submits_per_minute: int | None = Field(default=None, ge=0)
    limit_submits_per_day: int | None = Field(default=None, ge=0)
    limit_tasks_in_flight: int | None = Field(default=None, ge=0)
    limit_streams: int | None = Field(default=None, ge=0)
    limits_refresh_s: float = Field(default=30.0, gt=0)

    # HTTP: extra names allowed in the Host header and extra browser origins (comma-separated),
    # beyond loopback and the public URL's own (DNS-rebinding protection).
    allowed_hosts: str = ""
    allowed_origins: str = ""
    # 2026-07-28 calls that cannot stream anything are answered as JSON, not SSE.
    json_responses: bool = True
    # Replay for 2025-11-25 streams (Last-Event-ID): events kept per stream, in all, and for how long.
    # Every answer of that era is an event (a few KB each): the total bounds the server's memory
    # whatever the call rate; a client resumes within seconds of a dropped connection.
    event_store_events_per_stream: int = 1000
    event_store_max_events: int = 10_000
    event_store_ttl_s: int = 600

    # The operator's view (controlplane/ops, controlplane/dashboard). /metrics and the dashboard
    # answer loopback clients only unless opened (the dashboard still asks for a token when auth
    # is configured; /metrics has none: open it only to a network your scraper is on).
    metrics: bool = True
    metrics_open: bool = False
    dashboard: bool = True
    dashboard_open: bool = False
    # A dashboard sign-in lasts this long (never past an OAuth token's own expiry).
    dashboard_session_s: int = Field(default=3600, gt=0)
    # OpenTelemetry traces of tasks (controlplane/ops/traces.py; the `otel` extra).
    otel: bool = False
    # How the server writes its log records on stderr: "text" for people, "json" (one object a
    # line, with task_id, attempt, provider, action and replica as fields) for a log store.
    log_format: Literal["text", "json"] = "text"

    # Loops.
    scheduler_interval_s: float = 0.5
    # A placement's site (provider and region) is skipped for `cooldown_s` after `failures`
    # failures (capacity refusals, failed launches, failed polls) within `window_s`, then probed
    # by one attempt; a failed probe doubles the cool-down, up to `max_cooldown_s`.
    placement_breaker_failures: int = Field(default=3, ge=1)
    placement_breaker_window_s: float = Field(default=300.0, gt=0)
    placement_breaker_cooldown_s: float = Field(default=60.0, ge=0)
    placement_breaker_max_cooldown_s: float = Field(default=1800.0, ge=0)
    reconcile_interval_s: float = 2.0
    leader_lease_s: float = 15.0
    # Runner heartbeats and lost-job detection.
    heartbeat_interval_s: float = 10.0
    heartbeat_timeout_s: float = 90.0
    # Seconds a job may take from launch to its first sign of life before it is presumed lost.
    start_timeout_s: float = 600.0
    # SIGTERM -> SIGKILL grace for a job's process tree.
    kill_grace_s: float = 5.0
    # How long a job's runner waits for the control plane to answer its claim before it claims
    # the attempt in the object store itself (the tool starts only once the claim is held).
    claim_wait_s: float = 60.0
    # How long a cancelled/timed-out job may take to confirm it stopped before we stop waiting.
    stop_confirm_timeout_s: float = 120.0

    # A streaming wait (wait_task, a followed task) repeats the latest progress after this much
    # silence, so that proxies and clients do not cut an idle SSE stream (docs/design/streaming.md: 15 s).
    keepalive_s: float = 15.0

    # Limits on what a caller can send.
    max_input_bytes: int = 256 * 1024
    # How many tasks a submit may wait for (`after`; docs/design/dependencies.md).
    max_parents: int = Field(default=64, ge=1, le=1000)
    # How many shards one submit_sweep may make (docs/design/sweeps.md); above it SWEEP_TOO_LARGE.
    sweep_max_shards: int = Field(default=10_000, ge=1)
    # Waiting children one transaction settles at most when their parent ends (or is cancelled
    # with cascade); the reconciler settles the rest, a batch per transaction, spending at most
    # release_cycle_s of a cycle on them (docs/design/dependencies.md).
    release_batch: int = Field(default=500, ge=1)
    release_cycle_s: float = Field(default=1.0, ge=0)
    # Prefixes of object-store or https URLs a task's file input may name (comma-separated; empty:
    # none, only upload:// and artifact:// references: docs/design/references.md).
    input_url_prefixes: str = ""
    max_tags: int = 32
    max_tag_length: int = 128
    max_log_page: int = 1000
    max_list_page: int = 200
    default_ttl_s: int = 7 * 24 * 3600
    max_ttl_s: int = 90 * 24 * 3600
    # Retention after expiry: an expired task's row (its tombstone: "expired", not "not found")
    # and its ended job rows are purged this long after it expired; the audit (task_events) is
    # kept this long from each event, so by default for a year, beyond any task's ttl.
    purge_after_s: float = Field(default=30 * 24 * 3600, ge=0)
    audit_retention_s: float = Field(default=365 * 24 * 3600, ge=0)
    # Expiry and purging work in batches of this many tasks (or audit events), each batch one
    # short write transaction, and a reconciler cycle starts no new batch once it has spent
    # retention_cycle_s on them: a backlog is worked off over several cycles (controlplane/retention.py).
    retention_batch: int = Field(default=100, ge=1)
    retention_cycle_s: float = Field(default=0.5, ge=0)
    # Log lines longer than this are cut (and flagged truncated).
    max_log_line_bytes: int = 16 * 1024
    # Per-task log cap: older lines beyond this many are dropped and the page says so.
    max_log_lines_per_task: int = 5_000_000

    # Artifact links.
    artifact_url_ttl_s: int = 3600
    max_artifact_url_ttl_s: int = 7 * 24 * 3600

    # How a job reaches the object store. `identity`: with the cloud identity it runs as (which
    # then needs read and write on the bucket). `grants`: with no storage credential at all, only
    # URLs the control plane signs for its own attempt's keys (POST .../grants on the runner API);
    # the Terraform modules deploy this way.
    job_store_access: Literal["identity", "grants"] = "identity"
    # Lifetime of a grant asked for as it is needed (inputs.json, artifacts).
    grant_url_ttl_s: int = Field(default=900, gt=0)
    # Grants asked for ahead (result.json and a pool of event-spill keys, used when the callback
    # is down) live for the task's max runtime plus this margin (capped by the store's signing).
    grant_run_margin_s: int = Field(default=1800, ge=0)

    # Uploads (create_upload): a pending or complete upload and its object are deleted this long
    # after it was created; a file up to upload_single_max_bytes goes in one PUT, a larger one in
    # the store's resumable form (parts or chunks of at least that size); upload links live
    # upload_url_ttl_s (asking for the plan again signs new ones), at most until the upload expires.
    upload_ttl_s: int = Field(default=7 * 24 * 3600, gt=0)
    upload_single_max_bytes: int = Field(default=64 * 1024 * 1024, ge=5 * 1024 * 1024)
    upload_url_ttl_s: int = Field(default=24 * 3600, ge=60)

    # Job runners keep their own settings (CONTROLPLANE_<PROVIDER>_*, in each provider module).

    @field_validator("home", mode="before")
    @classmethod
    def _expand_home(cls, v: object) -> object:
        if isinstance(v, str | os.PathLike):
            return absolute_home(v)
        return v

    # ---- derived layout -------------------------------------------------------------------
    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'controlplane.db'}"

    @property
    def resolved_catalog_path(self) -> Path:
        return self.catalog_path or self.home / "catalog.toml"

    @property
    def resolved_prices_path(self) -> Path:
        return self.prices_file or self.home / "prices.toml"

    @property
    def resolved_object_store_url(self) -> str:
        return self.object_store_url or (self.home / "objects").resolve().as_uri()

    @property
    def endpoint_file(self) -> Path:
        """The URL the running server listens on, for local runners that outlive a restart."""
        return self.home / "endpoint.json"

    def ensure_home(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)

    def secret_key(self) -> bytes:
        """The server's signing key (artifact links, runner callback secrets), made on first use.

        CONTROLPLANE_SECRET_KEY overrides the file so that several replicas can share one key.
        """
        env = os.environ.get("CONTROLPLANE_SECRET_KEY")
        if env:
            return env.encode()
        self.ensure_home()
        path = self.home / "secret.key"
        try:
            return path.read_bytes().strip()
        except FileNotFoundError:
            pass
        key = secrets.token_hex(32).encode()
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        try:
            os.link(tmp, path)  # first writer wins; a concurrent starter reads the winner's key
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        return path.read_bytes().strip()

    def allowed_host_list(self) -> list[str]:
        return [h.strip() for h in self.allowed_hosts.split(",") if h.strip()]

    def allowed_origin_list(self) -> list[str]:
        return [o.strip() for o in self.allowed_origins.split(",") if o.strip()]

    @property
    def oauth(self) -> bool:
        """Whether OAuth access tokens are accepted (an issuer is configured)."""
        return bool(self.auth_issuer)


def csv(value: str | None) -> list[str]:
    """A comma-separated setting as a list (blanks dropped)."""
    return [v.strip() for v in (value or "").split(",") if v.strip()]
