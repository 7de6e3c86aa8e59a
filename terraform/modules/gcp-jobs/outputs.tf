output "environment" {
  description = "The CONTROLPLANE_* settings to give the control plane (export them, or put them in its environment)."
  value = {
    CONTROLPLANE_OBJECT_STORE_URL = "gs://${google_storage_bucket.objects.name}"
    CONTROLPLANE_GCS_SIGNER_EMAIL = one(google_service_account.signer[*].email)
    CONTROLPLANE_JOB_STORE_ACCESS = var.job_store_access
  }
}

output "catalog" {
  description = "The catalog with each tool pointed at its Cloud Run job, as JSON: save it (terraform output -raw catalog > catalog.json) and set CONTROLPLANE_CATALOG_PATH to it."
  value       = module.settings.catalog
}

output "jobs" {
  description = "Tool -> its Cloud Run job: name, id, image, cpu, memory_mb (what `controlplane catalog check` compares)."
  value = { for tool, job in google_cloud_run_v2_job.tool : tool => {
    name      = job.name
    id        = "${local.job_prefix}/${job.name}"
    image     = module.settings.jobs[tool].image
    cpu       = module.settings.jobs[tool].cpu
    memory_mb = module.settings.jobs[tool].memory_mb
  } }
}

output "provider_options" {
  description = "Tool -> the provider_options that point it at its Cloud Run job, as the catalog output has them."
  value       = local.provider_options
}

output "bucket" {
  description = "The object store's bucket."
  value       = google_storage_bucket.objects.name
}
