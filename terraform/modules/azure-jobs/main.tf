# Container Apps jobs for a control plane that runs elsewhere (a laptop): a storage account, a
# Log Analytics workspace, a Consumption-only Container Apps environment (no VNet) with one
# manual-trigger job per catalog tool, each with its own identity. Nothing here costs anything
# while no job runs (storage and log retention aside). The outputs are the settings and the
# catalog to give the control plane.

data "azurerm_client_config" "current" {}

locals {
  tags         = merge({ "controlplane-deployment" = var.name }, var.tags)
  storage_name = substr("${replace(var.name, "-", "")}${substr(sha256(azurerm_resource_group.this.id), 0, 12)}", 0, 24)
}

module "settings" {
  source           = "../settings"
  name             = var.name
  catalog          = var.catalog
  provider_name    = "container_apps"
  provider_options = local.provider_options
}

locals {
  provider_options = { for tool, job in azurerm_container_app_job.tool : tool => {
    job = job.id
  } }
}

resource "azurerm_resource_group" "this" {
  name     = var.resource_group_name
  location = var.location
  tags     = local.tags
}

resource "azurerm_log_analytics_workspace" "this" {
  name                = "${var.name}-logs"
  resource_group_name = azurerm_resource_group.this.name
  location            = azurerm_resource_group.this.location
  sku                 = "PerGB2018"
  retention_in_days   = var.log_retention_days
  tags                = local.tags
}

resource "azurerm_storage_account" "objects" {
  #checkov:skip=CKV_AZURE_59:Agents download artifacts through signed links to the blob endpoint, from outside Azure; the account admits no anonymous access and no shared keys.
  #checkov:skip=CKV2_AZURE_33:No private endpoint: the blob endpoint serves signed artifact links and jobs outside any VNet.
  #checkov:skip=CKV2_AZURE_1:Encrypted at rest with Microsoft-managed keys plus infrastructure encryption; a customer-managed key would need a Key Vault key and its own rotation.
  #checkov:skip=CKV_AZURE_33:The account has no queues.
  #checkov:skip=CKV_AZURE_43:The name is computed (the name without hyphens and a digest of the resource group id, cut to 24): lowercase letters and digits, as the rule asks; checkov cannot evaluate it.
  #checkov:skip=CKV_AZURE_206:Task objects expire with their tasks; storage_replication picks LRS (the cheapest idle, what a laptop's jobs need) or ZRS (through a zone failure).
  name                              = local.storage_name
  resource_group_name               = azurerm_resource_group.this.name
  location                          = azurerm_resource_group.this.location
  account_tier                      = "Standard"
  account_replication_type          = var.storage_replication
  account_kind                      = "StorageV2"
  min_tls_version                   = "TLS1_2"
  https_traffic_only_enabled        = true
  shared_access_key_enabled         = false # links are signed with user-delegation keys
  allow_nested_items_to_be_public   = false
  infrastructure_encryption_enabled = true
  local_user_enabled                = false
  tags                              = local.tags
  blob_properties {
    delete_retention_policy {
      days = 7
    }
    container_delete_retention_policy {
      days = 7
    }
  }
  sas_policy {
    expiration_period = "07.00:00:00" # artifact links live at most 7 days
    expiration_action = "Log"
  }
}

resource "azurerm_storage_container" "objects" {
  #checkov:skip=CKV2_AZURE_21:Blob reads are authorized per identity and by signed link; turn on the account's diagnostic settings to log them.
  name                  = "objects"
  storage_account_id    = azurerm_storage_account.objects.id
  container_access_type = "private"
}

resource "azurerm_container_app_environment" "jobs" {
  name                       = "${var.name}-jobs"
  resource_group_name        = azurerm_resource_group.this.name
  location                   = azurerm_resource_group.this.location
  log_analytics_workspace_id = azurerm_log_analytics_workspace.this.id
  workload_profile {
    name                  = "Consumption"
    workload_profile_type = "Consumption"
  }
  tags = local.tags
}

resource "azurerm_container_app_job" "tool" {
  for_each                     = module.settings.jobs
  name                         = module.settings.job_names[each.key]
  resource_group_name          = azurerm_resource_group.this.name
  location                     = azurerm_resource_group.this.location
  container_app_environment_id = azurerm_container_app_environment.jobs.id
  workload_profile_name        = "Consumption"
  replica_timeout_in_seconds   = each.value.max_runtime_s + 600 # a backstop: the control plane stops executions itself
  replica_retry_limit          = 0                              # the control plane retries by its catalog's policy
  tags                         = merge(local.tags, { "controlplane-tool" = each.key })
  manual_trigger_config {
    parallelism              = 1
    replica_completion_count = 1
  }
  # Its own identity (system-assigned: no client id to pass, since each start replaces the env).
  identity {
    type = "SystemAssigned"
  }
  dynamic "registry" {
    for_each = var.registry == null ? [] : [var.registry]
    content {
      server   = registry.value.server
      identity = "System"
    }
  }
  template {
    container {
      name   = "runner"
      image  = each.value.image
      cpu    = each.value.cpu
      memory = format("%gGi", each.value.memory_mb / 1024)
    }
  }
  lifecycle {
    precondition {
      condition     = module.settings.job_names_unique && length(module.settings.job_names[each.key]) <= 32
      error_message = "Job names are <name>-<tool>, lowercased with '_' as '-', at most 32 characters (Azure's limit), one per tool: shorten or rename the tool, or the name."
    }
    precondition {
      condition     = each.value.gpu == 0 && each.value.cpu >= 0.25 && each.value.cpu <= 4 && floor(each.value.cpu * 4) == each.value.cpu * 4 && each.value.memory_mb == each.value.cpu * 2048
      error_message = "Tool ${each.key}: resource class ${each.value.resource_class} (cpu ${each.value.cpu}, memory_mb ${each.value.memory_mb}, gpu ${each.value.gpu}) is not a Container Apps Consumption shape: cpu 0.25 to 4 in steps of 0.25 with memory_mb = cpu x 2048, and no GPU (Consumption has none)."
    }
  }
}
