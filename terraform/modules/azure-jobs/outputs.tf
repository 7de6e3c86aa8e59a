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
