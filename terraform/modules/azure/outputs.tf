output "mcp_url" {
  description = "The MCP endpoint agents connect to."
  value       = module.settings.mcp_url
}

output "oauth" {
  description = "What to configure in MCP clients and the identity provider: the resource (token audience), the protected resource metadata URL, the scopes."
  value       = module.settings.oauth
}

output "app_fqdn" {
  description = "The control plane's default name (bind public_hostname to the app to use your own)."
  value       = azurerm_container_app.server.ingress[0].fqdn
}

output "jobs" {
  description = "Tool -> the Container Apps job made for it, as applied (read by `controlplane catalog check`)."
  value       = module.jobs.jobs
}

output "catalog_sha256" {
  description = "Digest of the catalog the server was given (CONTROLPLANE_CATALOG_JSON)."
  value       = module.settings.catalog_sha256
}

output "migrate_command" {
  description = "Runs the migration (`controlplane db upgrade`) by hand, e.g. ahead of a rollout; not needed otherwise: each new revision migrates at start."
  value       = "az containerapp job start --name ${azurerm_container_app_job.migrate.name} --resource-group ${module.jobs.resource_group.name}"
}

output "storage_account" {
  description = "The object store's storage account."
  value       = module.jobs.storage.account_name
}
