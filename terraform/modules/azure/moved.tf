# What modules/azure-jobs makes now was made here before: these addresses move existing objects
# into the module instead of destroying and recreating them (Terraform >= 1.1 reads `moved`).

moved {
  from = azurerm_resource_group.this
  to   = module.jobs.azurerm_resource_group.this
}

moved {
  from = azurerm_log_analytics_workspace.this
  to   = module.jobs.azurerm_log_analytics_workspace.this
}

moved {
  from = azurerm_storage_account.objects
  to   = module.jobs.azurerm_storage_account.objects
}

moved {
  from = azurerm_storage_container.objects
  to   = module.jobs.azurerm_storage_container.objects
}

moved {
  from = azurerm_container_app_environment.jobs
  to   = module.jobs.azurerm_container_app_environment.jobs
}

moved {
  from = azurerm_container_app_job.tool
  to   = module.jobs.azurerm_container_app_job.tool
}
