# Service accounts and what each may do (README.md, "Identities"). Grants are on the resource
# (a job, the bucket, a secret, a service account) wherever Google Cloud allows it.

resource "google_service_account" "server" {
  project      = var.project
  account_id   = "${var.name}-server"
  display_name = "${var.name}: the control plane"
  depends_on   = [google_project_service.apis]
}

resource "google_service_account" "migrate" {
  project      = var.project
  account_id   = "${var.name}-migrate"
  display_name = "${var.name}: the one-shot database migration"
  depends_on   = [google_project_service.apis]
}

# ---- the control plane -------------------------------------------------------------------------
# Run, watch and cancel executions of its own jobs, granted on each job (not the project).
resource "google_project_iam_custom_role" "job_runner" {
  project     = var.project
  role_id     = replace("${var.name}_job_runner", "-", "_")
  title       = "${var.name}: run and watch its tool jobs"
  description = "Run a job with per-execution overrides, read and cancel its executions."
  permissions = ["run.jobs.get", "run.jobs.run", "run.jobs.runWithOverrides", "run.executions.get",
  "run.executions.list", "run.executions.cancel"]
  depends_on = [google_project_service.apis]
}

resource "google_cloud_run_v2_job_iam_member" "server" {
  for_each = module.jobs.jobs
  project  = var.project
  location = var.region
  name     = each.value.name
  role     = google_project_iam_custom_role.job_runner.id
  member   = google_service_account.server.member
}

# No iam.serviceAccountUser on the jobs' account: running a job, with overrides, is authorized by
# run.jobs.run and run.jobs.runWithOverrides on the job (Cloud Run's jobs.run reference); the
# job's account was set when Terraform made the job.

# Cloud Logging authorizes reading entries per project (a log view cannot select one job's
# executions by name), so this one grant is project-wide: read log entries, nothing else.
resource "google_project_iam_custom_role" "log_reader" {
  project     = var.project
  role_id     = replace("${var.name}_log_reader", "-", "_")
  title       = "${var.name}: read job logs"
  description = "Read log entries (the provider tails its executions' logs)."
  permissions = ["logging.logEntries.list"]
  depends_on  = [google_project_service.apis]
}

resource "google_project_iam_member" "server_logs" {
  project = var.project
  role    = google_project_iam_custom_role.log_reader.id
  member  = google_service_account.server.member
}

resource "google_storage_bucket_iam_member" "server" {
  bucket = module.jobs.bucket
  role   = "roles/storage.objectUser"
  member = google_service_account.server.member
}

# Signed artifact links on Cloud Run are signed through IAM signBlob as the service's own account.
resource "google_service_account_iam_member" "server_signs_as_itself" {
  service_account_id = google_service_account.server.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = google_service_account.server.member
}

resource "google_secret_manager_secret_iam_member" "server" {
  for_each = merge(var.secret_environment, { database_url = google_secret_manager_secret.database_url.id,
  secret_key = google_secret_manager_secret.secret_key.id })
  project   = var.project
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.server.member
}

# ---- tool jobs ---------------------------------------------------------------------------------
# Their service account is modules/gcp-jobs', with none on the bucket: a job reads its inputs and
# writes its result, events and artifacts through URLs the control plane signs (signBlob, above)
# for its own attempt's keys (job_store_access = "grants"), so it cannot reach another task's objects.

# ---- the migration -----------------------------------------------------------------------------
resource "google_secret_manager_secret_iam_member" "migrate" {
  project   = var.project
  secret_id = google_secret_manager_secret.database_url.id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.migrate.member
}
