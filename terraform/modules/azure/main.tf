# The control plane on Azure: a container app in a VNet-integrated environment, PostgreSQL Flexible
# Server on a private subnet and Key Vault, with managed identities (iam.tf); its jobs (the resource
# group, the storage account, Log Analytics, the jobs' own environment outside the VNet and one
# manual-trigger job per catalog tool) are modules/azure-jobs'. moved.tf keeps deployments made
# before the split in place.

data "azurerm_client_config" "current" {}

locals {
  tags       = merge({ "controlplane-deployment" = var.name }, var.tags)
  app_fqdn   = "${var.name}.${azurerm_container_app_environment.this.default_domain}"
  public_url = "https://${coalesce(var.public_hostname, local.app_fqdn)}"

  server_env = merge(module.settings.environment, {
    CONTROLPLANE_OBJECT_STORE_URL                 = "az://${module.jobs.storage.account_name}/${module.jobs.storage.container_name}"
    CONTROLPLANE_CONTAINER_APPS_SUBSCRIPTION_ID   = data.azurerm_client_config.current.subscription_id
    CONTROLPLANE_CONTAINER_APPS_WORKSPACE_ID      = module.jobs.log_analytics_workspace.workspace_id
    AZURE_CLIENT_ID                               = azurerm_user_assigned_identity.server.client_id
  })
}

# The catalog drives the jobs: one Container Apps job per tool (modules/azure-jobs), and the
# server's catalog points each tool at its own. The jobs' environment is outside the VNet: a tool
# runs code the control plane does not vet, and in the server's environment it would share the
# apps' subnet, which the database's NSG admits.
module "jobs" {
  source              = "../azure-jobs"
  name                = var.name
  resource_group_name = var.resource_group_name
  location            = var.location
  catalog             = var.catalog
  job_store_access    = "grants" # as the settings module tells the server
  registry            = var.registry
  job_acr_pull        = false # acr_pull (iam.tf) grants it, and the apps wait for it
  storage_replication = "ZRS"
  log_retention_days  = var.log_retention_days
  tags                = var.tags
}

module "settings" {
  source           = "../settings"
  name             = var.name
  catalog          = var.catalog
  provider_name    = "container_apps"
  provider_options = module.jobs.provider_options
  oauth            = var.oauth
  public_url       = local.public_url
}

locals {
  resource_group = module.jobs.resource_group
}

# ---- network: the apps' subnet, and the database's (private, delegated) -------------------------
resource "azurerm_virtual_network" "this" {
  name                = var.name
  resource_group_name = local.resource_group.name
  location            = local.resource_group.location
  address_space       = [var.address_space]
  tags                = local.tags
}

resource "azurerm_subnet" "apps" {
  name                 = "apps"
  resource_group_name  = local.resource_group.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = [cidrsubnet(var.address_space, 1, 0)]
  delegation {
    name = "container-apps"
    service_delegation {
      name    = "Microsoft.App/environments"
      actions = ["Microsoft.Network/virtualNetworks/subnets/join/action"]
    }
  }
}

resource "azurerm_subnet" "db" {
  name                 = "db"
  resource_group_name  = local.resource_group.name
  virtual_network_name = azurerm_virtual_network.this.name
  address_prefixes     = [cidrsubnet(var.address_space, 2, 2)]
  delegation {
    name = "postgres"
    service_delegation {
      name    = "Microsoft.DBforPostgreSQL/flexibleServers"
      actions = ["Microsoft.Network/virtualNetworks/subnets/join/action"]
    }
  }
}

resource "azurerm_network_security_group" "db" {
  name                = "${var.name}-db"
  resource_group_name = local.resource_group.name
  location            = local.resource_group.location
  tags                = local.tags
  security_rule {
    name                       = "postgres-from-apps"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = "5432"
    source_address_prefix      = azurerm_subnet.apps.address_prefixes[0]
    destination_address_prefix = azurerm_subnet.db.address_prefixes[0]
  }
  security_rule {
    # zone-redundant HA: the primary and the standby (both in this subnet) replicate over 5432
    name                       = "postgres-within-db-subnet"
    priority                   = 110
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = "5432"
    source_address_prefix      = azurerm_subnet.db.address_prefixes[0]
    destination_address_prefix = azurerm_subnet.db.address_prefixes[0]
  }
  security_rule {
    name                       = "deny-other-vnet-inbound"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "VirtualNetwork"
    destination_address_prefix = "*"
  }
}

resource "azurerm_subnet_network_security_group_association" "db" {
  subnet_id                 = azurerm_subnet.db.id
  network_security_group_id = azurerm_network_security_group.db.id
}

resource "azurerm_network_security_group" "apps" {
  name                = "${var.name}-apps"
  resource_group_name = local.resource_group.name
  location            = local.resource_group.location
  tags                = local.tags
}

resource "azurerm_subnet_network_security_group_association" "apps" {
  subnet_id                 = azurerm_subnet.apps.id
  network_security_group_id = azurerm_network_security_group.apps.id
}

resource "azurerm_private_dns_zone" "db" {
  name                = "${var.name}.private.postgres.database.azure.com"
  resource_group_name = local.resource_group.name
  tags                = local.tags
}

resource "azurerm_private_dns_zone_virtual_network_link" "db" {
  name                  = "${var.name}-db"
  resource_group_name   = local.resource_group.name
  private_dns_zone_name = azurerm_private_dns_zone.db.name
  virtual_network_id    = azurerm_virtual_network.this.id
  tags                  = local.tags
}

# ---- database ----------------------------------------------------------------------------------
resource "random_password" "db" {
  length  = 40
  special = false # it is part of a URL
}

resource "random_password" "secret_key" {
  length  = 64
  special = false
}

resource "azurerm_postgresql_flexible_server" "this" {
  #checkov:skip=CKV2_AZURE_57:The server is VNet-integrated instead (a delegated private subnet, public access off, private DNS): Azure offers private endpoints only to servers with public access networking.
  name                          = "${var.name}-${substr(sha256(local.resource_group.id), 0, 8)}"
  resource_group_name           = local.resource_group.name
  location                      = local.resource_group.location
  version                       = "16"
  sku_name                      = var.db_sku
  storage_mb                    = 32768
  delegated_subnet_id           = azurerm_subnet.db.id
  private_dns_zone_id           = azurerm_private_dns_zone.db.id
  public_network_access_enabled = false
  administrator_login           = "controlplane"
  administrator_password        = random_password.db.result
  backup_retention_days         = 14
  geo_redundant_backup_enabled  = true
  zone                          = "1"
  dynamic "high_availability" {
    for_each = var.db_high_availability ? [1] : []
    content {
      mode                      = "ZoneRedundant"
      standby_availability_zone = "2"
    }
  }
  tags       = local.tags
  depends_on = [azurerm_private_dns_zone_virtual_network_link.db]
}

resource "azurerm_postgresql_flexible_server_configuration" "tls" {
  server_id = azurerm_postgresql_flexible_server.this.id
  name      = "require_secure_transport"
  value     = "on"
}

resource "azurerm_postgresql_flexible_server_database" "this" {
  name      = "controlplane"
  server_id = azurerm_postgresql_flexible_server.this.id
  charset   = "UTF8"
  collation = "en_US.utf8"
}

resource "azurerm_management_lock" "db" {
  count      = var.deletion_protection ? 1 : 0
  name       = "${var.name}-db"
  scope      = azurerm_postgresql_flexible_server.this.id
  lock_level = "CanNotDelete"
  notes      = "The control plane's tasks; set deletion_protection = false to remove it."
}

# ---- secrets -----------------------------------------------------------------------------------
resource "azurerm_key_vault" "this" {
  #checkov:skip=CKV_AZURE_109:Container Apps resolves Key Vault references from outside the VNet (it is not a trusted service for the vault firewall); access is by Azure RBAC, granted per secret to the identities in iam.tf.
  #checkov:skip=CKV_AZURE_189:As above: the vault keeps its public endpoint for Container Apps' secret references and for Terraform; RBAC per secret guards it.
  #checkov:skip=CKV2_AZURE_32:No private endpoint, for the reason above.
  name                       = "${var.name}-${substr(sha256(local.resource_group.id), 0, 8)}"
  resource_group_name        = local.resource_group.name
  location                   = local.resource_group.location
  tenant_id                  = data.azurerm_client_config.current.tenant_id
  sku_name                   = "standard"
  rbac_authorization_enabled = true
  purge_protection_enabled   = var.deletion_protection
  soft_delete_retention_days = 7
  tags                       = local.tags
  network_acls {
    default_action = "Allow"
    bypass         = "AzureServices"
  }
}

# Terraform itself writes the two secrets, once its own assignment has propagated.
resource "azurerm_role_assignment" "deployer_writes_secrets" {
  scope                = azurerm_key_vault.this.id
  role_definition_name = "Key Vault Secrets Officer"
  principal_id         = data.azurerm_client_config.current.object_id
}

resource "time_sleep" "deployer_rbac" {
  create_duration = var.rbac_propagation_wait
  triggers        = { assignment = azurerm_role_assignment.deployer_writes_secrets.id }
}

resource "azurerm_key_vault_secret" "database_url" {
  #checkov:skip=CKV_AZURE_41:The URL embeds the database's password, rotated by replacing random_password.db and applying; an expiry would stop the control plane at a date rather than at a rotation.
  name         = "database-url"
  key_vault_id = azurerm_key_vault.this.id
  content_type = "text/uri"
  value        = "postgresql://controlplane:${random_password.db.result}@${azurerm_postgresql_flexible_server.this.fqdn}:5432/controlplane?sslmode=require"
  depends_on   = [time_sleep.deployer_rbac]
}

resource "azurerm_key_vault_secret" "secret_key" {
  #checkov:skip=CKV_AZURE_41:The key signs artifact links and runner credentials of tasks in flight; it is rotated deliberately (replace random_password.secret_key), not by expiry.
  name         = "secret-key"
  key_vault_id = azurerm_key_vault.this.id
  content_type = "text/plain"
  value        = random_password.secret_key.result
  depends_on   = [time_sleep.deployer_rbac]
}

# ---- Container Apps ----------------------------------------------------------------------------
resource "azurerm_container_app_environment" "this" {
  name                       = var.name
  resource_group_name        = local.resource_group.name
  location                   = local.resource_group.location
  log_analytics_workspace_id = module.jobs.log_analytics_workspace.id
  infrastructure_subnet_id   = azurerm_subnet.apps.id
  workload_profile {
    name                  = "Consumption"
    workload_profile_type = "Consumption"
  }
  tags = local.tags
}

# The migration by hand (`controlplane db upgrade`, the `migrate_command` output), e.g. ahead of a
# rollout. Not needed for one: each new revision migrates when it starts, under PostgreSQL's
# advisory lock, before it listens (CONTROLPLANE_MIGRATE_ON_START).
resource "azurerm_container_app_job" "migrate" {
  name                         = "${var.name}-migrate"
  resource_group_name          = local.resource_group.name
  location                     = local.resource_group.location
  container_app_environment_id = azurerm_container_app_environment.this.id
  workload_profile_name        = "Consumption"
  replica_timeout_in_seconds   = 600
  replica_retry_limit          = 1
  tags                         = local.tags
  lifecycle {
    precondition {
      condition     = !contains(values(module.settings.job_names), "${var.name}-migrate")
      error_message = "A tool's job would be named <name>-migrate, this job's name: rename the tool."
    }
  }
  manual_trigger_config {
    parallelism              = 1
    replica_completion_count = 1
  }
  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.migrate.id]
  }
  dynamic "registry" {
    for_each = var.registry == null ? [] : [var.registry]
    content {
      server   = registry.value.server
      identity = azurerm_user_assigned_identity.migrate.id
    }
  }
  secret {
    name                = "database-url"
    key_vault_secret_id = azurerm_key_vault_secret.database_url.versionless_id
    identity            = azurerm_user_assigned_identity.migrate.id
  }
  template {
    container {
      name    = "migrate"
      image   = var.control_plane_image
      command = ["controlplane", "db", "upgrade"]
      cpu     = 0.5
      memory  = "1Gi"
      env {
        name        = "CONTROLPLANE_DATABASE_URL"
        secret_name = "database-url"
      }
    }
  }
  depends_on = [time_sleep.rbac_propagation]
}

resource "azurerm_container_app" "server" {
  name                         = var.name
  resource_group_name          = local.resource_group.name
  container_app_environment_id = azurerm_container_app_environment.this.id
  revision_mode                = "Single"
  workload_profile_name        = "Consumption"
  tags                         = local.tags
  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.server.id]
  }
  dynamic "registry" {
    for_each = var.registry == null ? [] : [var.registry]
    content {
      server   = registry.value.server
      identity = azurerm_user_assigned_identity.server.id
    }
  }
  secret {
    name                = "database-url"
    key_vault_secret_id = azurerm_key_vault_secret.database_url.versionless_id
    identity            = azurerm_user_assigned_identity.server.id
  }
  secret {
    name                = "secret-key"
    key_vault_secret_id = azurerm_key_vault_secret.secret_key.versionless_id
    identity            = azurerm_user_assigned_identity.server.id
  }
  ingress {
    external_enabled           = true
    target_port                = 8080
    transport                  = "http"
    allow_insecure_connections = false
    traffic_weight {
      latest_revision = true
      percentage      = 100
    }
  }
  template {
    min_replicas = var.min_replicas
    max_replicas = var.max_replicas
    container {
      name   = "controlplane"
      image  = var.control_plane_image
      cpu    = 0.5
      memory = "1Gi"
      dynamic "env" {
        for_each = local.server_env
        content {
          name  = env.key
          value = env.value
        }
      }
      env {
        name        = "CONTROLPLANE_DATABASE_URL"
        secret_name = "database-url"
      }
      env {
        name        = "CONTROLPLANE_SECRET_KEY"
        secret_name = "secret-key"
      }
      liveness_probe {
        transport = "HTTP"
        port      = 8080
        path      = "/healthz"
      }
      readiness_probe {
        transport = "HTTP"
        port      = 8080
        path      = "/healthz"
      }
    }
  }
  depends_on = [time_sleep.rbac_propagation]
}
