# Cloud Run jobs for a control plane that runs elsewhere (a laptop): a GCS bucket, one Cloud Run
# job per catalog tool, the jobs' service account and a service account that signs artifact
# links (user credentials cannot sign). Nothing here costs anything while no job runs (GCS
# storage aside). The outputs are the settings and the catalog to give the control plane.

locals {
  labels     = merge({ "controlplane-deployment" = var.name }, var.labels)
  job_prefix = "projects/${var.project}/locations/${var.region}/jobs"
  # vCPU -> [least, most] memory (MiB) a Cloud Run job takes with it (at least 1 vCPU for a job)
  cloud_run_memory_mb = {
    "1" = [512, 4096]
    "2" = [512, 8192]
    "4" = [2048, 16384]
    "6" = [4096, 24576]
    "8" = [4096, 32768]
  }
}

module "settings" {
  source           = "../settings"
  name             = var.name
  catalog          = var.catalog
  provider_name    = "cloud_run"
  provider_options = local.provider_options
}

locals {
  provider_options = { for tool, job in google_cloud_run_v2_job.tool : tool => {
    job = "${local.job_prefix}/${job.name}"
  } }
}

resource "google_project_service" "apis" {
  for_each = toset(var.enable_apis ? ["run.googleapis.com", "iam.googleapis.com", "iamcredentials.googleapis.com",
  "logging.googleapis.com", "storage.googleapis.com"] : [])
  project            = var.project
  service            = each.value
  disable_on_destroy = false
}

resource "google_storage_bucket" "objects" {
  #checkov:skip=CKV_GCP_62:Access to task objects is through the service accounts here and signed links; turn on Data Access audit logs for storage.googleapis.com to log reads.
  #checkov:skip=CKV_GCP_78:Objects are written once and deleted when their task is purged; versioning would keep purged task data that retention must remove.
  project                     = var.project
  name                        = "${var.project}-${var.name}-objects"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy # task data only; the control plane purges it by its own retention
  labels                      = local.labels
  depends_on                  = [google_project_service.apis]
  lifecycle_rule {
    condition {
      age = 2
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }
}

resource "google_service_account" "jobs" {
  project      = var.project
  account_id   = "${var.name}-jobs"
  display_name = "${var.name}: tool jobs (the runner)"
  depends_on   = [google_project_service.apis]
}

# Artifact links are V4 signed URLs; gcloud's user credentials hold no key, so the control plane
# signs through IAM signBlob as this account (CONTROLPLANE_GCS_SIGNER_EMAIL).
resource "google_service_account" "signer" {
  count        = var.signer ? 1 : 0
  project      = var.project
  account_id   = "${var.name}-signer"
  display_name = "${var.name}: signs the control plane's artifact links"
  depends_on   = [google_project_service.apis]
}

resource "google_storage_bucket_iam_member" "signer" {
  count  = var.signer ? 1 : 0
  bucket = google_storage_bucket.objects.name
  role   = "roles/storage.objectUser"
  member = google_service_account.signer[0].member
}

resource "google_storage_bucket_iam_member" "jobs" {
  count  = var.job_store_access == "identity" ? 1 : 0
  bucket = google_storage_bucket.objects.name
  role   = "roles/storage.objectUser"
  member = google_service_account.jobs.member
}

resource "google_cloud_run_v2_job" "tool" {
  for_each            = module.settings.jobs
  project             = var.project
  name                = module.settings.job_names[each.key]
  location            = var.region
  deletion_protection = false # a job holds no data
  labels              = merge(local.labels, { "controlplane-tool" = substr(replace(lower(each.key), "_", "-"), 0, 63) })
  template {
    task_count = 1
    template {
      service_account = google_service_account.jobs.email
      max_retries     = 0 # the control plane retries by its catalog's policy
      timeout         = "${min(each.value.max_runtime_s + 600, 604800)}s"
      containers {
        image = each.value.image
        resources {
          limits = {
            cpu    = tostring(each.value.cpu)
            memory = "${each.value.memory_mb}Mi"
          }
        }
      }
    }
  }
  lifecycle {
    precondition {
      condition     = module.settings.job_names_unique && length(module.settings.job_names[each.key]) <= 63
      error_message = "Job names are <name>-<tool>, lowercased with '_' as '-': one per tool, at most 63 characters (Cloud Run's limit): shorten or rename the tool, or the name."
    }
    precondition {
      condition     = each.value.gpu == 0 && each.value.memory_mb >= try(local.cloud_run_memory_mb[tostring(each.value.cpu)][0], 1000000000) && each.value.memory_mb <= try(local.cloud_run_memory_mb[tostring(each.value.cpu)][1], 0)
      error_message = "Tool ${each.key}: resource class ${each.value.resource_class} (cpu ${each.value.cpu}, memory_mb ${each.value.memory_mb}, gpu ${each.value.gpu}) is not a Cloud Run job shape: cpu 1, 2, 4, 6 or 8 with 512-4096, 512-8192, 2048-16384, 4096-24576, 4096-32768 MiB; this module makes no GPU jobs."
    }
  }
  depends_on = [google_project_service.apis]
}

# ---- the operator: what the control plane's own credentials need --------------------------------
resource "google_project_iam_custom_role" "job_runner" {
  count       = var.operator_member == null ? 0 : 1
  project     = var.project
  role_id     = replace("${var.name}_job_runner", "-", "_")
  title       = "${var.name}: run and watch its tool jobs"
  description = "Run a job with per-execution overrides, read and cancel its executions."
  permissions = ["run.jobs.get", "run.jobs.run", "run.jobs.runWithOverrides", "run.executions.get",
  "run.executions.list", "run.executions.cancel"]
  depends_on = [google_project_service.apis]
}

resource "google_cloud_run_v2_job_iam_member" "operator" {
  for_each = var.operator_member == null ? {} : google_cloud_run_v2_job.tool
  project  = var.project
  location = var.region
  name     = each.value.name
  role     = google_project_iam_custom_role.job_runner[0].id
  member   = var.operator_member
}

resource "google_project_iam_custom_role" "log_reader" {
  count       = var.operator_member == null ? 0 : 1
  project     = var.project
  role_id     = replace("${var.name}_log_reader", "-", "_")
  title       = "${var.name}: read job logs"
  description = "Read log entries (the provider tails its executions' logs)."
  permissions = ["logging.logEntries.list"]
  depends_on  = [google_project_service.apis]
}

resource "google_project_iam_member" "operator_logs" {
  count   = var.operator_member == null ? 0 : 1
  project = var.project
  role    = google_project_iam_custom_role.log_reader[0].id
  member  = var.operator_member
}

resource "google_storage_bucket_iam_member" "operator" {
  count  = var.operator_member == null ? 0 : 1
  bucket = google_storage_bucket.objects.name
  role   = "roles/storage.objectUser"
  member = var.operator_member
}

resource "google_service_account_iam_member" "operator_signs" {
  count              = var.operator_member == null || !var.signer ? 0 : 1
  service_account_id = google_service_account.signer[0].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = var.operator_member
}
