# The jobs' roles. The job role reads and writes the bucket only with job_store_access =
# "identity"; with "grants" it has no permission at all (the control plane signs URLs for each
# attempt's own keys). The execution role writes the jobs' log streams and pulls their images.

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

resource "aws_iam_role" "job" {
  name               = "${var.name}-job"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "job_objects" {
  statement {
    sid       = "ItsBucketsObjects"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${aws_s3_bucket.objects.arn}/*"]
  }
}

resource "aws_iam_role_policy" "job_objects" {
  count  = var.job_store_access == "identity" ? 1 : 0
  name   = "objects"
  role   = aws_iam_role.job.id
  policy = data.aws_iam_policy_document.job_objects.json
}

resource "aws_iam_role" "job_execution" {
  name               = "${var.name}-job-execution"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "job_execution" {
  statement {
    sid       = "WriteJobLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.jobs.arn}:log-stream:*"]
  }
  dynamic "statement" {
    for_each = length(local.ecr_repository_arns) > 0 ? [1] : []
    content {
      sid       = "PullImages"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = local.ecr_repository_arns
    }
  }
  dynamic "statement" {
    for_each = length(local.ecr_repository_arns) > 0 ? [1] : []
    content {
      sid       = "RegistryToken" # ECR authorizes GetAuthorizationToken on "*" only
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }
}

resource "aws_iam_role_policy" "job_execution" {
  name   = "job-execution"
  role   = aws_iam_role.job_execution.id
  policy = data.aws_iam_policy_document.job_execution.json
}

# What the person (or machine) running the control plane needs: attach it to their user or role.
# Not attached here: the module does not know who that is.
data "aws_iam_policy_document" "operator" {
  statement {
    sid       = "SubmitToItsQueueWithItsJobDefinitions"
    actions   = ["batch:SubmitJob"]
    resources = concat([aws_batch_job_queue.this.arn], [for name in values(module.settings.job_names) : "${local.batch_arn}:job-definition/${name}:*"])
  }
  statement {
    sid       = "TagAndStopJobs" # job ARNs carry an id Batch picks
    actions   = ["batch:TagResource", "batch:TerminateJob"]
    resources = ["${local.batch_arn}:job/*"]
  }
  statement {
    sid       = "ReadJobs" # Batch authorizes these on "*" only
    actions   = ["batch:DescribeJobs", "batch:ListJobs", "batch:DescribeJobDefinitions"]
    resources = ["*"]
  }
  statement {
    sid       = "ReadItsJobsLogs"
    actions   = ["logs:GetLogEvents"]
    resources = ["${aws_cloudwatch_log_group.jobs.arn}:log-stream:*"]
  }
  statement {
    sid       = "ItsBucket"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.objects.arn}/*"]
  }
  statement {
    sid       = "ListItsBucket"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.objects.arn]
  }
}
