# Managed identities and what each may do (README.md, "Identities"). Every role is assigned on the
# narrowest scope Azure offers for it: a job, a secret, the container, the workspace.

resource "azurerm_user_assigned_identity" "server" {
  name                = "${var.name}-server"
  resource_group_name = local.resource_group.name
  location            = local.resource_group.location
  tags                = local.tags
}

resource "azurerm_user_assigned_identity" "migrate" {
  name                = "${var.name}-migrate"
  resource_group_name = local.resource_group.name
  location            = local.resource_group.location
  tags                = local.tags
}

# ---- the control plane -------------------------------------------------------------------------
# Start, read and stop executions of its own jobs: a role of exactly those operations, assigned
# on each tool job.
# The provider stops one execution (Jobs_StopExecution: jobs/stop/execution/action), never all of a
# job's (jobs/stop/action, not granted). Role names are unique per tenant: this one carries the
# resource group's id digest, so two deployments named alike do not collide.
resource "azurerm_role_definition" "job_runner" {
  name        = "${var.name}-job-runner-${substr(sha256(local.resource_group.id), 0, 8)}"
  scope       = local.resource_group.id
  description = "Start a Container Apps job, read it and its executions, stop one of its executions."
  permissions {
    actions = ["Microsoft.App/jobs/read", "Microsoft.App/jobs/*/read", "Microsoft.App/jobs/start/action",
    "Microsoft.App/jobs/stop/execution/action"]
  }
  assignable_scopes = [local.resource_group.id]
}

resource "azurerm_role_assignment" "server_runs_jobs" {
  for_each           = module.jobs.jobs
  scope              = each.value.id
  role_definition_id = azurerm_role_definition.job_runner.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.server.principal_id
}

# The jobs' console logs, in the deployment's own workspace.
resource "azurerm_role_assignment" "server_reads_logs" {
  scope                = module.jobs.log_analytics_workspace.id
  role_definition_name = "Log Analytics Reader"
  principal_id         = azurerm_user_assigned_identity.server.principal_id
}

resource "azurerm_role_assignment" "server_objects" {
  scope                = module.jobs.storage.container_id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_user_assigned_identity.server.principal_id
}

# Artifact links are signed with a user-delegation key (no account keys exist).
resource "azurerm_role_assignment" "server_delegates" {
  scope                = module.jobs.storage.account_id
  role_definition_name = "Storage Blob Delegator"
  principal_id         = azurerm_user_assigned_identity.server.principal_id
}

resource "azurerm_role_assignment" "server_secrets" {
  for_each             = { database_url = azurerm_key_vault_secret.database_url.resource_versionless_id, secret_key = azurerm_key_vault_secret.secret_key.resource_versionless_id }
  scope                = each.value
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.server.principal_id
}

# ---- tool jobs ---------------------------------------------------------------------------------
# Each job's own identity is modules/azure-jobs'. None on the storage account: a job reads its inputs and writes its result, events and artifacts
# through SAS URLs the control plane signs with a user delegation key for its own attempt's blobs
# (CONTROLPLANE_JOB_STORE_ACCESS=grants), so it cannot reach another task's objects. A job's
# identity pulls its image (AcrPull, below) and nothing else.

# ---- the migration -----------------------------------------------------------------------------
resource "azurerm_role_assignment" "migrate_secret" {
  scope                = azurerm_key_vault_secret.database_url.resource_versionless_id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.migrate.principal_id
}

# ---- image pulls (a private registry) ----------------------------------------------------------
resource "azurerm_role_assignment" "acr_pull" {
  for_each = var.registry == null ? {} : merge(
    { server = azurerm_user_assigned_identity.server.principal_id, migrate = azurerm_user_assigned_identity.migrate.principal_id },
    { for tool, principal_id in module.jobs.job_principal_ids : "job-${tool}" => principal_id },
  )
  scope                = var.registry.id
  role_definition_name = "AcrPull"
  principal_id         = each.value
}

# Azure RBAC takes minutes to reach Key Vault and the registry after an assignment is made: an app
# or job created at once fails its first secret read or image pull (403). The apps wait this long
# after their assignments on the first apply (later applies find them in place and do not wait).
resource "time_sleep" "rbac_propagation" {
  create_duration = var.rbac_propagation_wait
  triggers = {
    secrets = join(",", concat([for a in azurerm_role_assignment.server_secrets : a.id], [azurerm_role_assignment.migrate_secret.id]))
    pulls   = join(",", [for a in azurerm_role_assignment.acr_pull : a.id])
  }
}
