# What modules/gcp-jobs makes now was made here before: these addresses move existing objects
# into the module instead of destroying and recreating them (Terraform >= 1.1 reads `moved`).

moved {
  from = google_storage_bucket.objects
  to   = module.jobs.google_storage_bucket.objects
}

moved {
  from = google_service_account.jobs
  to   = module.jobs.google_service_account.jobs
}

moved {
  from = google_cloud_run_v2_job.tool
  to   = module.jobs.google_cloud_run_v2_job.tool
}
