output "mcp_url" {
  description = "The MCP URL to give agents."
  value       = module.controlplane.mcp_url
}

output "oauth" {
  description = "OAuth settings for clients and the identity provider (resource / audience, metadata URL, scopes)."
  value       = module.controlplane.oauth
}

output "jobs" {
  description = "Tool -> its Cloud Run job (for `controlplane catalog check`)."
  value       = module.controlplane.jobs
}

output "batch_jobs" {
  description = "Tool -> its AWS Batch job definition, each tool's second placement (`controlplane catalog check` compares it too)."
  value       = module.aws_jobs.jobs
}

output "migrate_command" {
  description = "The database migration by hand (each new revision migrates at start; this is for migrating ahead of one)."
  value       = module.controlplane.migrate_command
}
