output "environment" {
  description = "The CONTROLPLANE_* settings to give the control plane (export them, or put them in its environment)."
  value = {
    CONTROLPLANE_OBJECT_STORE_URL = "s3://${aws_s3_bucket.objects.bucket}"
    CONTROLPLANE_AWS_BATCH_REGION = local.region
    CONTROLPLANE_JOB_STORE_ACCESS = var.job_store_access
  }
}

output "catalog" {
  description = "The catalog with each tool pointed at its job definition, as JSON: save it (terraform output -raw catalog > catalog.json) and set CONTROLPLANE_CATALOG_PATH to it."
  value       = module.settings.catalog
}

output "jobs" {
  description = "Tool -> its job definition: name, id (ARN), image, cpu, memory_mb (what `controlplane catalog check` compares)."
  value = { for tool, def in aws_batch_job_definition.tool : tool => {
    name      = def.name
    id        = def.arn
    image     = module.settings.jobs[tool].image
    cpu       = module.settings.jobs[tool].cpu
    memory_mb = module.settings.jobs[tool].memory_mb
  } }
}

output "operator_policy" {
  description = "The IAM policy (JSON) the control plane's own credentials need: attach it to the user or role that runs it."
  value       = data.aws_iam_policy_document.operator.json
}

output "provider_options" {
  description = "Tool -> the provider_options that point it at its job (the queue, its job definition, the log group), as the catalog output has them."
  value       = local.provider_options
}

output "bucket" {
  description = "The object store's bucket: name and ARN."
  value       = { name = aws_s3_bucket.objects.bucket, arn = aws_s3_bucket.objects.arn }
}

output "job_queue_arn" {
  description = "ARN of the jobs' queue."
  value       = aws_batch_job_queue.this.arn
}

output "log_group_arn" {
  description = "ARN of the jobs' CloudWatch log group."
  value       = aws_cloudwatch_log_group.jobs.arn
}
