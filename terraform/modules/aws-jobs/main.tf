# Cloud jobs for a control plane that runs elsewhere (a laptop): an S3 bucket, AWS Batch on
# Fargate with one job definition per catalog tool, the jobs' log group and their least-privilege
# roles. No load balancer, database, NAT gateway or KMS key: nothing here costs anything while no
# job runs (S3 storage aside). The outputs are the settings and the catalog to give the control
# plane; what the person running it needs to be allowed is the `operator_policy` output.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  region    = data.aws_region.current.region
  partition = data.aws_partition.current.partition
  tags      = merge({ "controlplane:deployment" = var.name }, var.tags)
  batch_arn = "arn:${local.partition}:batch:${local.region}:${local.account}"

  # ECR repositories of the images: those named, and each one an ECR image URI names
  ecr_uri = "^([0-9]{12})\\.dkr\\.ecr\\.([a-z0-9-]+)\\.amazonaws\\.com(?:\\.cn)?/([^:@]+)"
  ecr_repository_arns = distinct(concat(var.ecr_repository_arns, [for job in module.settings.jobs :
    format("arn:%s:ecr:%s:%s:repository/%s", local.partition, regex(local.ecr_uri, job.image)[1], regex(local.ecr_uri, job.image)[0], regex(local.ecr_uri, job.image)[2])
  if can(regex(local.ecr_uri, job.image))]))

  # vCPU -> the memory (MiB) Fargate pairs with it (AWS Batch on Fargate: resourceRequirements)
  fargate_memory_mb = {
    "0.25" = [512, 1024, 2048]
    "0.5"  = range(1024, 4097, 1024)
    "1"    = range(2048, 8193, 1024)
    "2"    = range(4096, 16385, 1024)
    "4"    = range(8192, 30721, 1024)
    "8"    = range(16384, 61441, 4096)
    "16"   = range(32768, 122881, 8192)
  }
}

module "settings" {
  source           = "../settings"
  name             = var.name
  catalog          = var.catalog
  provider_name    = "aws_batch"
  provider_options = local.provider_options
}

locals {
  provider_options = { for tool, def in aws_batch_job_definition.tool : tool => {
    job_queue      = aws_batch_job_queue.this.name
    job_definition = def.arn # pinned to the revision this apply made
    log_group      = aws_cloudwatch_log_group.jobs.name
  } }
}

# ---- object store ------------------------------------------------------------------------------
resource "aws_s3_bucket" "objects" {
  #checkov:skip=CKV_AWS_18:Task objects are reached by the job role and the operator's own credentials; enable CloudTrail S3 data events for an access log.
  #checkov:skip=CKV_AWS_144:Task inputs, results and artifacts expire with their task; a replica in another region would outlive the retention the control plane enforces.
  #checkov:skip=CKV_AWS_21:Objects are written once and deleted when their task is purged; versioning would keep purged task data that retention must remove.
  #checkov:skip=CKV2_AWS_62:Nothing reacts to object events: the runner reports to the control plane itself.
  #checkov:skip=CKV_AWS_145:SSE-S3 unless kms_key_arn names a key: a customer-managed key costs a monthly fee while nothing runs, and this module alone costs nothing idle.
  bucket        = var.bucket_name
  bucket_prefix = var.bucket_name == null ? "${var.name}-objects-" : null
  force_destroy = var.force_destroy # task data only; the control plane purges it by its own retention
  tags          = local.tags
}

resource "aws_s3_bucket_public_access_block" "objects" {
  bucket                  = aws_s3_bucket.objects.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "objects" {
  bucket = aws_s3_bucket.objects.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "objects" {
  bucket = aws_s3_bucket.objects.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = var.kms_key_arn == null ? "AES256" : "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = var.kms_key_arn != null
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "objects" {
  bucket = aws_s3_bucket.objects.id
  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyPlainHttp"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.objects.arn, "${aws_s3_bucket.objects.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "objects" {
  bucket = aws_s3_bucket.objects.id
  policy = data.aws_iam_policy_document.bucket.json
}

# ---- logs and network --------------------------------------------------------------------------
resource "aws_cloudwatch_log_group" "jobs" {
  #checkov:skip=CKV_AWS_158:CloudWatch's own encryption unless kms_key_arn names a key, which costs a monthly fee while nothing runs.
  name              = "/aws/batch/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = local.tags
}

resource "aws_security_group" "jobs" {
  name        = "${var.name}-jobs"
  description = "Batch jobs: no inbound; HTTPS out to S3, the registry, CloudWatch Logs and the control plane"
  vpc_id      = var.vpc_id
  tags        = local.tags
  lifecycle {
    # a new description would replace the group, and the compute environment's network with it:
    # a group moved here from modules/aws keeps its own words
    ignore_changes = [description]
  }
}

resource "aws_vpc_security_group_egress_rule" "jobs_https" {
  security_group_id = aws_security_group.jobs.id
  description       = "S3, the image registry, CloudWatch Logs and the control plane's callback URL"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

# ---- AWS Batch on Fargate: one job definition per catalog tool ----------------------------------
resource "aws_batch_compute_environment" "this" {
  name_prefix = "${var.name}-"
  type        = "MANAGED"
  compute_resources {
    type               = "FARGATE"
    max_vcpus          = var.max_vcpus
    subnets            = var.subnet_ids
    security_group_ids = [aws_security_group.jobs.id]
  }
  tags = local.tags
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_batch_job_queue" "this" {
  name     = var.name
  state    = "ENABLED"
  priority = 1
  compute_environment_order {
    order               = 1
    compute_environment = aws_batch_compute_environment.this.arn
  }
  tags = local.tags
}

resource "aws_batch_job_definition" "tool" {
  for_each              = module.settings.jobs
  name                  = module.settings.job_names[each.key]
  type                  = "container"
  platform_capabilities = ["FARGATE"]
  propagate_tags        = true
  retry_strategy {
    attempts = 1 # the control plane retries by its catalog's policy
  }
  timeout {
    attempt_duration_seconds = each.value.max_runtime_s + 600 # a backstop: the control plane stops jobs itself
  }
  container_properties = jsonencode({
    image = each.value.image
    resourceRequirements = [
      { type = "VCPU", value = tostring(each.value.cpu) },
      { type = "MEMORY", value = tostring(each.value.memory_mb) },
    ]
    jobRoleArn                   = aws_iam_role.job.arn
    executionRoleArn             = aws_iam_role.job_execution.arn
    networkConfiguration         = { assignPublicIp = var.assign_public_ip ? "ENABLED" : "DISABLED" }
    fargatePlatformConfiguration = { platformVersion = "LATEST" }
    readonlyRootFilesystem       = false # the runner's scratch directory lives in the container's /tmp
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        "awslogs-group"         = aws_cloudwatch_log_group.jobs.name
        "awslogs-region"        = local.region
        "awslogs-stream-prefix" = module.settings.job_names[each.key]
      }
    }
  })
  tags = merge(local.tags, { "controlplane:tool" = each.key })
  lifecycle {
    precondition {
      condition     = module.settings.job_names_unique && length(module.settings.job_names[each.key]) <= 128
      error_message = "Job definition names are <name>-<tool>, lowercased with '_' as '-': one per tool, at most 128 characters (Batch's limit): rename one."
    }
    precondition {
      condition     = each.value.gpu == 0 && contains(try(local.fargate_memory_mb[tostring(each.value.cpu)], []), each.value.memory_mb)
      error_message = "Tool ${each.key}: resource class ${each.value.resource_class} (cpu ${each.value.cpu}, memory_mb ${each.value.memory_mb}, gpu ${each.value.gpu}) is not a Fargate shape: vCPU 0.25, 0.5, 1, 2, 4, 8 or 16 with the memory Fargate pairs with it (1 vCPU: 2048 to 8192 in steps of 1024), and no GPU (Fargate has none)."
    }
  }
}
