output "environment" {
  description = "The CONTROLPLANE_* settings to give the control plane (export them, or put them in its environment)."
  value = {
    CONTROLPLANE_OBJECT_STORE_URL               = "az://${azurerm_storage_account.objects.name}/${azurerm_storage_container.objects.name}"
    CONTROLPLANE_CONTAINER_APPS_SUBSCRIPTION_ID = data.azurerm_client_config.current.subscription_id
    CONTROLPLANE_CONTAINER_APPS_WORKSPACE_ID    = azurerm_log_analytics_workspace.this.workspace_id
    CONTROLPLANE_JOB_STORE_ACCESS               = var.job_store_access
  }
}

output "catalog" {
  description = "The catalog with each tool pointed at its Container Apps job, as JSON: save it (terraform output -raw catalog > catalog.json) and set CONTROLPLANE_CATALOG_PATH to it."
  value       = module.settings.catalog
}

output "jobs" {
  description = "Tool -> its Container Apps job: name, id, image, cpu, memory_mb (what `controlplane catalog check` compares)."
  value = { for tool, job in azurerm_container_app_job.tool : tool => {
    name      = job.name
    id        = job.id
    image     = module.settings.jobs[tool].image
    cpu       = module.settings.jobs[tool].cpu
    memory_mb = module.settings.jobs[tool].memory_mb
  } }
}

output "provider_options" {
  description = "Tool -> the provider_options that point it at its Container Apps job, as the catalog output has them."
  value       = local.provider_options
}

output "job_principal_ids" {
  description = "Tool -> the principal id of its job's own (system-assigned) identity."
  value       = { for tool, job in azurerm_container_app_job.tool : tool => job.identity[0].principal_id }
}

output "resource_group" {
  description = "The resource group everything is in: name, id, location."
  value       = { name = azurerm_resource_group.this.name, id = azurerm_resource_group.this.id, location = azurerm_resource_group.this.location }
}

output "log_analytics_workspace" {
  description = "The Log Analytics workspace of the jobs' console logs: id (the resource's) and workspace_id (what queries name)."
  value       = { id = azurerm_log_analytics_workspace.this.id, workspace_id = azurerm_log_analytics_workspace.this.workspace_id }
}

output "storage" {
  description = "The object store: the storage account's name and id, the container's name and id."
  value = {
    account_name   = azurerm_storage_account.objects.name
    account_id     = azurerm_storage_account.objects.id
    container_name = azurerm_storage_container.objects.name
    container_id   = azurerm_storage_container.objects.id
  }
}
