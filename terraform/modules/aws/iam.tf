# Identities and what each may do (README.md, "Identities"). Actions are scoped to this
# deployment's resources wherever the API allows it; the few that AWS authorizes only on "*"
# (Batch's Describe/List calls, ECR's token) say so where they are granted.

locals {
  batch_arn     = "arn:${local.partition}:batch:${local.region}:${local.account}"
  job_def_arns  = [for tool, name in module.settings.job_names : "${local.batch_arn}:job-definition/${name}:*"]
  # ECR repositories of the images: those named, and those of every image that is an ECR URI
  # (<account>.dkr.ecr.<region>.amazonaws.com/<repository>[:tag|@digest])
  ecr_image_repos = distinct([for image in concat([var.control_plane_image], [for job in module.settings.jobs : job.image]) :
    format("arn:%s:ecr:%s:%s:repository/%s", local.partition, regex(local.ecr_uri, image)[1], regex(local.ecr_uri, image)[0], regex(local.ecr_uri, image)[2])
  if can(regex(local.ecr_uri, image))])
  ecr_uri              = "^([0-9]{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/([^:@]+)"
  ecr_repository_arns  = distinct(concat(var.ecr_repository_arns, local.ecr_image_repos))
  ecr_pull             = length(local.ecr_repository_arns) > 0
}

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

# ---- the control plane (ECS task role) ---------------------------------------------------------
resource "aws_iam_role" "server" {
  name               = "${var.name}-server"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

data "aws_iam_policy_document" "server" {
  statement {
    sid       = "SubmitToItsQueueWithItsJobDefinitions"
    actions   = ["batch:SubmitJob"]
    resources = concat([module.jobs.job_queue_arn], local.job_def_arns)
  }
  statement {
    sid       = "TagAndStopJobs" # job ARNs carry an id Batch picks: they can be named no closer
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
    actions   = ["logs:GetLogEvents"] # the provider reads each job's own stream, never filters
    resources = ["${module.jobs.log_group_arn}:log-stream:*", module.jobs.log_group_arn]
  }
  statement {
    sid       = "ItsBucket" # PutObject and GetObject also sign the jobs' upload and input URLs
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${module.jobs.bucket.arn}/*"]
  }
  statement {
    sid       = "ListItsBucket"
    actions   = ["s3:ListBucket"]
    resources = [module.jobs.bucket.arn]
  }
  statement {
    sid       = "ItsKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.this.arn]
  }
}

resource "aws_iam_role_policy" "server" {
  name   = "controlplane"
  role   = aws_iam_role.server.id
  policy = data.aws_iam_policy_document.server.json
}

# ---- ECS execution role (pulls the image, writes the service's logs, reads its two secrets) ------
resource "aws_iam_role" "execution" {
  name               = "${var.name}-execution"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

# Pulling the images from ECR (none needed for images in public registries).
data "aws_iam_policy_document" "ecr_pull" {
  dynamic "statement" {
    for_each = local.ecr_pull ? [1] : []
    content {
      sid       = "PullImages"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = local.ecr_repository_arns
    }
  }
  dynamic "statement" {
    for_each = local.ecr_pull ? [1] : []
    content {
      sid       = "RegistryToken" # ECR authorizes GetAuthorizationToken on "*" only
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }
}

data "aws_iam_policy_document" "execution" {
  source_policy_documents = [data.aws_iam_policy_document.ecr_pull.json]
  statement {
    sid       = "WriteServiceLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.service.arn}:log-stream:*"]
  }
  statement {
    sid       = "ReadItsSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.database_url.arn, aws_secretsmanager_secret.secret_key.arn]
  }
  statement {
    sid       = "DecryptItsSecrets"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.this.arn]
  }
}

resource "aws_iam_role_policy" "execution" {
  name   = "execution"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

# ---- RDS enhanced monitoring -----------------------------------------------------------------
data "aws_iam_policy_document" "rds_monitoring_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["monitoring.rds.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
  }
}

resource "aws_iam_role" "rds_monitoring" {
  name               = "${var.name}-rds-monitoring"
  assume_role_policy = data.aws_iam_policy_document.rds_monitoring_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "rds_monitoring" {
  role       = aws_iam_role.rds_monitoring.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

# ---- the key's policy ----------------------------------------------------------------------------
# The jobs' roles, with none on the bucket (job_store_access = "grants": a job reaches its own
# attempt's keys through URLs the control plane presigns), are modules/aws-jobs'.
data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_111:This is a key policy: its "*" resource is this one key, and the account-root statement is the AWS default that lets IAM policies (iam.tf) grant use of it.
  #checkov:skip=CKV_AWS_356:This is a key policy: "*" names the key the policy is attached to, nothing else.
  #checkov:skip=CKV_AWS_109:This is a key policy: administration is left to the account's IAM (the AWS default key policy), not opened to anyone.
  statement {
    sid       = "AccountAdministersTheKey"
    actions   = ["kms:*"]
    resources = ["*"] # in a key policy "*" is this key
    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account}:root"]
    }
  }
  statement {
    sid       = "CloudWatchLogsEncryptsItsGroups"
    actions   = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]
    resources = ["*"] # in a key policy "*" is this key
    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account}:log-group:*"]
    }
  }
}
