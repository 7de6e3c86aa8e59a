# What modules/aws-jobs makes now was made here before: these addresses move existing objects
# into the module instead of destroying and recreating them (Terraform >= 1.1 reads `moved`).

moved {
  from = aws_s3_bucket.objects
  to   = module.jobs.aws_s3_bucket.objects
}

moved {
  from = aws_s3_bucket_public_access_block.objects
  to   = module.jobs.aws_s3_bucket_public_access_block.objects
}

moved {
  from = aws_s3_bucket_ownership_controls.objects
  to   = module.jobs.aws_s3_bucket_ownership_controls.objects
}

moved {
  from = aws_s3_bucket_server_side_encryption_configuration.objects
  to   = module.jobs.aws_s3_bucket_server_side_encryption_configuration.objects
}

moved {
  from = aws_s3_bucket_lifecycle_configuration.objects
  to   = module.jobs.aws_s3_bucket_lifecycle_configuration.objects
}

moved {
  from = aws_s3_bucket_policy.objects
  to   = module.jobs.aws_s3_bucket_policy.objects
}

moved {
  from = aws_cloudwatch_log_group.jobs
  to   = module.jobs.aws_cloudwatch_log_group.jobs
}

moved {
  from = aws_security_group.jobs
  to   = module.jobs.aws_security_group.jobs
}

moved {
  from = aws_vpc_security_group_egress_rule.jobs_https
  to   = module.jobs.aws_vpc_security_group_egress_rule.jobs_https
}

moved {
  from = aws_batch_compute_environment.this
  to   = module.jobs.aws_batch_compute_environment.this
}

moved {
  from = aws_batch_job_queue.this
  to   = module.jobs.aws_batch_job_queue.this
}

moved {
  from = aws_batch_job_definition.tool
  to   = module.jobs.aws_batch_job_definition.tool
}

moved {
  from = aws_iam_role.job
  to   = module.jobs.aws_iam_role.job
}

moved {
  from = aws_iam_role.job_execution
  to   = module.jobs.aws_iam_role.job_execution
}

moved {
  from = aws_iam_role_policy.job_execution
  to   = module.jobs.aws_iam_role_policy.job_execution
}
