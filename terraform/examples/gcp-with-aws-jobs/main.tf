# Two clouds, one control plane: the control plane on Google Cloud (modules/gcp), whose tools run
# on Cloud Run first and on AWS Batch (modules/aws-jobs, the jobs only) when Cloud Run has no
# room. The server's catalog lists both placements for every tool: Cloud Run's, waiting
# `patience_s` for a job to start, then the Batch job definition made for the same tool.
#
#   controlplane catalog export catalog.toml --default-image <tools image> -o catalog.json
#   terraform init && terraform apply -var-file=my.tfvars
#
# Data: every task's objects are in the Google Cloud bucket. The full module's jobs use signed
# grants (CONTROLPLANE_JOB_STORE_ACCESS=grants), so Batch jobs, which hold no Google identity,
# read and write their own attempt's objects through URLs the control plane signs: the Batch
# jobs are made with `job_store_access = "grants"` too, their role holding no storage permission,
# and must reach the control plane's URL. (modules/aws-jobs also makes an S3 bucket; nothing
# uses it here.)
#
# The control plane calls AWS Batch with an IAM user's keys you keep in Secret Manager (the
# `aws_access_key_secret` and `aws_secret_key_secret` secrets): attach the policy this makes
# (aws_iam_policy.operator) to that user.

provider "google" {
  project = var.project
  region  = var.region
}

provider "aws" {
  region = var.aws_region
}

module "aws_jobs" {
  source = "../../modules/aws-jobs"

  name             = var.name
  catalog          = file(var.catalog_file)
  vpc_id           = var.aws_vpc_id
  subnet_ids       = var.aws_subnet_ids
  job_store_access = "grants"
}

module "controlplane" {
  source = "../../modules/gcp"

  name                = var.name
  project             = var.project
  region              = var.region
  catalog             = file(var.catalog_file)
  control_plane_image = var.control_plane_image
  network             = var.network
  subnetwork          = var.subnetwork

  create_private_service_access = var.create_private_service_access
  public_hostname               = var.public_hostname
  oauth                         = var.oauth
  deletion_protection           = var.deletion_protection

  # each tool's second placement: the Batch job definition made for it
  more_placements = { for tool, options in module.aws_jobs.provider_options :
  tool => [{ provider = "aws_batch", provider_options = options }] }
  patience_s  = var.patience_s
  environment = { CONTROLPLANE_AWS_BATCH_REGION = module.aws_jobs.environment.CONTROLPLANE_AWS_BATCH_REGION }
  secret_environment = {
    AWS_ACCESS_KEY_ID     = var.aws_access_key_secret
    AWS_SECRET_ACCESS_KEY = var.aws_secret_key_secret
  }
}

# What the control plane's AWS credentials need: submit to the queue with these job definitions,
# describe, tag and terminate jobs, read their log streams.
resource "aws_iam_policy" "operator" {
  name        = "${var.name}-controlplane"
  description = "The control plane on Google Cloud: its AWS Batch jobs."
  policy      = module.aws_jobs.operator_policy
}
