# The control plane on Google Cloud: a Cloud Run service, Cloud SQL for PostgreSQL on a private IP
# and Secret Manager, each with its own service account (iam.tf); its jobs (one Cloud Run job per
# catalog tool, the bucket, the jobs' service account) are modules/gcp-jobs'. moved.tf keeps
# deployments made before the split in place.

# Read once the APIs are on (the Cloud Resource Manager API answers it; a fresh project has it off).
data "google_project" "this" {
  project_id = var.project
  depends_on = [google_project_service.apis]
}

locals {
  # Cloud Run's deterministic service URL, known before the service exists (the service is told
  # its own URL); a custom domain when one is mapped.
  run_url    = "https://${var.name}-${data.google_project.this.number}.${var.region}.run.app"
  public_url = var.public_hostname == null ? local.run_url : "https://${var.public_hostname}"
  labels     = merge({ "controlplane-deployment" = var.name }, var.labels)

  server_env = merge(var.environment, module.settings.environment, {
    CONTROLPLANE_OBJECT_STORE_URL = "gs://${module.jobs.bucket}"
  })
  secret_env = merge(var.secret_environment, {
    CONTROLPLANE_DATABASE_URL = google_secret_manager_secret.database_url.secret_id
    CONTROLPLANE_SECRET_KEY   = google_secret_manager_secret.secret_key.secret_id
  })
}

# The catalog drives the jobs: one Cloud Run job per tool (modules/gcp-jobs), and the server's
# catalog points each tool at its own. The server signs links as itself: no signer account.
module "jobs" {
  source           = "../gcp-jobs"
  name             = var.name
  project          = var.project
  region           = var.region
  catalog          = var.catalog
  job_store_access = "grants" # as the settings module tells the server
  signer           = false
  enable_apis      = false # the APIs below include the jobs'
  force_destroy    = !var.deletion_protection
  labels           = var.labels
  depends_on       = [google_project_service.apis]
}

module "settings" {
  source           = "../settings"
  name             = var.name
  catalog          = var.catalog
  provider_name    = "cloud_run"
  provider_options = module.jobs.provider_options
  more_placements  = var.more_placements
  patience_s       = var.patience_s
  oauth            = var.oauth
  public_url       = local.public_url
}

resource "google_project_service" "apis" {
  for_each = toset(["cloudresourcemanager.googleapis.com", "run.googleapis.com", "sqladmin.googleapis.com",
    "secretmanager.googleapis.com", "servicenetworking.googleapis.com", "iam.googleapis.com", "iamcredentials.googleapis.com",
  "logging.googleapis.com", "storage.googleapis.com", "compute.googleapis.com"])
  project            = var.project
  service            = each.value
  disable_on_destroy = false
}

# ---- secrets -----------------------------------------------------------------------------------
resource "random_password" "db" {
  length  = 40
  special = false # it is part of a URL
}

resource "random_password" "secret_key" {
  length  = 64
  special = false
}

resource "google_secret_manager_secret" "database_url" {
  project   = var.project
  secret_id = "${var.name}-database-url"
  labels    = local.labels
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

resource "google_secret_manager_secret_version" "database_url" {
  secret      = google_secret_manager_secret.database_url.id
  secret_data = "postgresql://controlplane:${random_password.db.result}@${google_sql_database_instance.this.private_ip_address}:5432/controlplane?sslmode=require"
}

resource "google_secret_manager_secret" "secret_key" {
  project   = var.project
  secret_id = "${var.name}-secret-key"
  labels    = local.labels
  replication {
    user_managed {
      replicas {
        location = var.region
      }
    }
  }
  depends_on = [google_project_service.apis]
}

resource "google_secret_manager_secret_version" "secret_key" {
  secret      = google_secret_manager_secret.secret_key.id
  secret_data = random_password.secret_key.result
}

# ---- database (private IP only) ----------------------------------------------------------------
resource "google_compute_global_address" "private_services" {
  count         = var.create_private_service_access ? 1 : 0
  project       = var.project
  name          = "${var.name}-private-services"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = 20
  network       = var.network
  depends_on    = [google_project_service.apis]
}

resource "google_service_networking_connection" "private_services" {
  count                   = var.create_private_service_access ? 1 : 0
  network                 = var.network
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.private_services[0].name]
  depends_on              = [google_project_service.apis]
}

resource "google_sql_database_instance" "this" {
  #checkov:skip=CKV_GCP_6:ssl_mode ENCRYPTED_ONLY refuses every connection without TLS; client certificates (what the check wants) would add a certificate per replica to rotate, on a database reachable only at a private IP.
  #checkov:skip=CKV_GCP_79:PostgreSQL 16 is the major version this module is written and reviewed for; move database_version forward after testing the control plane's migrations on a newer one.
  project             = var.project
  name                = var.name
  region              = var.region
  database_version    = "POSTGRES_16"
  deletion_protection = var.deletion_protection
  settings {
    tier              = var.db_tier
    edition           = "ENTERPRISE"
    availability_type = var.db_high_availability ? "REGIONAL" : "ZONAL"
    user_labels       = local.labels
    ip_configuration {
      ipv4_enabled    = false
      private_network = var.network
      ssl_mode        = "ENCRYPTED_ONLY"
    }
    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
    }
    insights_config {
      query_insights_enabled = true
    }
    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }
    database_flags {
      name  = "log_connections"
      value = "on"
    }
    database_flags {
      name  = "log_disconnections"
      value = "on"
    }
    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }
    database_flags {
      name  = "log_min_messages"
      value = "error"
    }
    database_flags {
      name  = "log_temp_files"
      value = "0"
    }
    database_flags {
      name  = "log_min_duration_statement"
      value = "-1"
    }
    database_flags {
      name  = "log_min_error_statement"
      value = "error"
    }
    database_flags {
      name  = "cloudsql.enable_pgaudit"
      value = "on"
    }
    database_flags {
      name  = "log_statement"
      value = "ddl"
    }
    database_flags {
      name  = "log_hostname"
      value = "on"
    }
    database_flags {
      name  = "log_duration"
      value = "on"
    }
  }
  depends_on = [google_service_networking_connection.private_services, google_project_service.apis]
}

resource "google_sql_database" "this" {
  project  = var.project
  instance = google_sql_database_instance.this.name
  name     = "controlplane"
}

resource "google_sql_user" "this" {
  project  = var.project
  instance = google_sql_database_instance.this.name
  name     = "controlplane"
  password = random_password.db.result
}

# ---- the control plane -------------------------------------------------------------------------
# The migration by hand: the same image, `controlplane db upgrade` (the `migrate_command` output),
# e.g. to migrate ahead of a rollout. Not needed for one: each new revision migrates when it
# starts, under PostgreSQL's advisory lock, before it listens (CONTROLPLANE_MIGRATE_ON_START,
# set by the settings module), so it serves only on a database at its schema.
resource "google_cloud_run_v2_job" "migrate" {
  project             = var.project
  name                = "${var.name}-migrate"
  location            = var.region
  deletion_protection = false
  labels              = local.labels
  template {
    task_count = 1
    template {
      service_account = google_service_account.migrate.email
      max_retries     = 1
      timeout         = "600s"
      vpc_access {
        network_interfaces {
          network    = var.network
          subnetwork = var.subnetwork
        }
        egress = "PRIVATE_RANGES_ONLY"
      }
      containers {
        image   = var.control_plane_image
        command = ["controlplane", "db", "upgrade"]
        env {
          name = "CONTROLPLANE_DATABASE_URL"
          value_source {
            secret_key_ref {
              secret  = google_secret_manager_secret.database_url.secret_id
              version = "latest"
            }
          }
        }
      }
    }
  }
  depends_on = [google_secret_manager_secret_version.database_url, google_secret_manager_secret_iam_member.migrate,
  google_sql_database.this, google_sql_user.this]
  lifecycle {
    precondition {
      condition     = !contains(values(module.settings.job_names), "${var.name}-migrate")
      error_message = "A tool's job would be named <name>-migrate, this job's name: rename the tool."
    }
  }
}

resource "google_cloud_run_v2_service" "server" {
  project             = var.project
  name                = var.name
  location            = var.region
  ingress             = "INGRESS_TRAFFIC_ALL" # the MCP endpoint is public; OAuth guards it
  deletion_protection = var.deletion_protection
  labels              = local.labels
  template {
    service_account                  = google_service_account.server.email
    timeout                          = "3600s" # streamed waits
    max_instance_request_concurrency = 80
    scaling {
      min_instance_count = var.min_instances
      max_instance_count = var.max_instances
    }
    vpc_access {
      network_interfaces {
        network    = var.network
        subnetwork = var.subnetwork
      }
      egress = "PRIVATE_RANGES_ONLY" # the database; Google APIs and the identity provider directly
    }
    containers {
      image = var.control_plane_image
      ports {
        container_port = 8080
      }
      resources {
        limits = {
          cpu    = "1"
          memory = "1Gi"
        }
        cpu_idle = false # the scheduler and reconciler run between requests
      }
      dynamic "env" {
        for_each = local.server_env
        content {
          name  = env.key
          value = env.value
        }
      }
      dynamic "env" {
        for_each = local.secret_env
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }
      startup_probe {
        http_get {
          path = "/healthz"
        }
        period_seconds    = 5
        failure_threshold = 12
      }
      liveness_probe {
        http_get {
          path = "/healthz"
        }
        period_seconds = 30
      }
    }
  }
  depends_on = [google_secret_manager_secret_version.database_url, google_secret_manager_secret_version.secret_key,
  google_secret_manager_secret_iam_member.server, google_sql_database.this, google_sql_user.this]
  lifecycle {
    precondition {
      condition     = length(local.server_env.CONTROLPLANE_CATALOG_JSON) <= 32768
      error_message = "The catalog the server is given (CONTROLPLANE_CATALOG_JSON) is over Cloud Run's 32,768 characters for one environment value: shorten descriptions and schemas, or split the deployment."
    }
  }
}

# MCP clients authenticate with OAuth access tokens the server checks (not Google IAM), so the
# service admits unauthenticated requests at the Cloud Run layer.
resource "google_cloud_run_v2_service_iam_member" "public" {
  #checkov:skip=CKV_GCP_102:The MCP endpoint is public by design: every /mcp request needs an OAuth access token the server verifies, the runner callbacks their per-attempt secret, downloads their signature.
  project  = var.project
  location = var.region
  name     = google_cloud_run_v2_service.server.name
  role     = "roles/run.invoker"
  member   = "allUsers"
}
