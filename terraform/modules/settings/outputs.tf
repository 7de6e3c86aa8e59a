output "jobs" {
  description = "Tool -> what its job runs: image, cpu, memory_mb, gpu, max_runtime_s, resource_class (from the catalog)."
  value       = local.jobs
}

output "job_names" {
  description = "Tool -> the name of its job (<name>-<tool>)."
  value       = local.job_names
}

output "job_names_unique" {
  description = "Whether every tool has a job name of its own (two tools differing only in case or '_'/'-' would share one)."
  value       = length(distinct(values(local.job_names))) == length(local.job_names)
}

output "environment" {
  description = "The CONTROLPLANE_* settings of the server (secrets aside: the cloud module adds the database URL and the secret key from its secret store)."
  value = merge(local.auth_env, {
    CONTROLPLANE_PUBLIC_URL       = var.public_url
    CONTROLPLANE_CATALOG_JSON     = jsonencode(local.server_catalog)
    # Each new revision migrates the database before it listens, under PostgreSQL's advisory
    # lock (one at a time; the others wait, then find it current): no manual step, and no
    # replica serves on a schema behind its code.
    CONTROLPLANE_MIGRATE_ON_START = "true"
    CONTROLPLANE_ALLOWED_HOSTS    = local.probe_hosts
    CONTROLPLANE_LOG_LEVEL        = "INFO"
    # Jobs hold no storage permission: they read and write their own attempt's keys through
    # URLs the control plane signs (README: "Jobs without storage credentials").
    CONTROLPLANE_JOB_STORE_ACCESS = "grants"
  })
}

output "catalog_sha256" {
  description = "Digest of the catalog the server is given."
  value       = sha256(jsonencode(local.server_catalog))
}

output "oauth" {
  description = "What to give MCP clients and the identity provider: the resource (the token audience), the metadata URL, the scopes."
  value = var.oauth == null ? null : {
    issuer                      = var.oauth.issuer
    resource                    = local.mcp_url
    audience                    = coalesce(var.oauth.audience, local.mcp_url)
    protected_resource_metadata = "${var.public_url}/.well-known/oauth-protected-resource/mcp"
    scopes                      = local.scopes
  }
}

output "mcp_url" {
  description = "The MCP endpoint agents connect to."
  value       = local.mcp_url
}

output "catalog" {
  description = "The catalog the server is given, as JSON (each tool pointed at its job): what a control plane elsewhere (a laptop) loads with CONTROLPLANE_CATALOG_PATH."
  value       = jsonencode(local.server_catalog)
}
