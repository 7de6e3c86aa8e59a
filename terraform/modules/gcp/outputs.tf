output "mcp_url" {
  description = "The MCP endpoint agents connect to."
  value       = module.settings.mcp_url
}

output "oauth" {
  description = "What to configure in MCP clients and the identity provider: the resource (token audience), the protected resource metadata URL, the scopes."
  value       = module.settings.oauth
}

output "service_uri" {
  description = "The service's run.app URL (the MCP URL's host unless public_hostname is mapped)."
  value       = google_cloud_run_v2_service.server.uri
}

output "jobs" {
  description = "Tool -> the Cloud Run job made for it, as applied (read by `controlplane catalog check`)."
  value       = module.jobs.jobs
}

output "catalog_sha256" {
  description = "Digest of the catalog the server was given (CONTROLPLANE_CATALOG_JSON)."
  value       = module.settings.catalog_sha256
}

output "migrate_command" {
  description = "Runs the migration (`controlplane db upgrade`) by hand, e.g. ahead of a rollout; not needed otherwise: each new revision migrates at start."
  value       = "gcloud run jobs execute ${google_cloud_run_v2_job.migrate.name} --project ${var.project} --region ${var.region} --wait"
}

output "bucket" {
  description = "The object store's bucket."
  value       = module.jobs.bucket
}
