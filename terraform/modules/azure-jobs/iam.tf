# Roles. A job's own (system-assigned) identity: the container's blobs with job_store_access =
# "identity" (none with "grants"), and AcrPull on a private registry. The operator (who runs the
# control plane): start, read and stop executions of these jobs, read their logs, the container's
# blobs, and user-delegation keys to sign links.

resource "azurerm_role_assignment" "job_objects" {
  for_each             = var.job_store_access == "identity" ? azurerm_container_app_job.tool : {}
  scope                = azurerm_storage_container.objects.id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = each.value.identity[0].principal_id
}

resource "azurerm_role_assignment" "job_pull" {
  for_each             = var.registry == null || !var.job_acr_pull ? {} : azurerm_container_app_job.tool
  scope                = var.registry.id
  role_definition_name = "AcrPull"
  principal_id         = each.value.identity[0].principal_id
}

# Role names are unique per tenant: this one carries a digest of the resource group id.
resource "azurerm_role_definition" "job_runner" {
  count       = var.operator_object_id == null ? 0 : 1
  name        = "${var.name}-job-runner-${substr(sha256(azurerm_resource_group.this.id), 0, 8)}"
  scope       = azurerm_resource_group.this.id
  description = "Start a Container Apps job, read it and its executions, stop one of its executions."
  permissions {
    actions = ["Microsoft.App/jobs/read", "Microsoft.App/jobs/*/read", "Microsoft.App/jobs/start/action",
    "Microsoft.App/jobs/stop/execution/action"]
  }
  assignable_scopes = [azurerm_resource_group.this.id]
}

resource "azurerm_role_assignment" "operator_runs_jobs" {
  for_each           = var.operator_object_id == null ? {} : azurerm_container_app_job.tool
  scope              = each.value.id
  role_definition_id = azurerm_role_definition.job_runner[0].role_definition_resource_id
  principal_id       = var.operator_object_id
}

resource "azurerm_role_assignment" "operator_reads_logs" {
  count                = var.operator_object_id == null ? 0 : 1
  scope                = azurerm_log_analytics_workspace.this.id
  role_definition_name = "Log Analytics Reader"
  principal_id         = var.operator_object_id
}

resource "azurerm_role_assignment" "operator_objects" {
  count                = var.operator_object_id == null ? 0 : 1
  scope                = azurerm_storage_container.objects.id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = var.operator_object_id
}

resource "azurerm_role_assignment" "operator_delegates" {
  count                = var.operator_object_id == null ? 0 : 1
  scope                = azurerm_storage_account.objects.id
  role_definition_name = "Storage Blob Delegator"
  principal_id         = var.operator_object_id
}
