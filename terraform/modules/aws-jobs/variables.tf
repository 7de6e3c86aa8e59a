variable "name" {
  description = "Prefix of every resource's name (lowercase letters, digits and single hyphens)."
  type        = string
  default     = "cp-jobs"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 20
    error_message = "name: 2 to 20 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "catalog" {
  description = "The tool catalog as `controlplane catalog export` writes it (JSON or YAML text): one job definition per tool."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets the jobs run in, with a route to the internet (the default VPC's public subnets: jobs get a public IP, no NAT gateway is needed, nothing idles)."
  type        = list(string)
}

variable "vpc_id" {
  description = "The VPC of `subnet_ids`."
  type        = string
}

variable "assign_public_ip" {
  description = "Give each job a public IP (public subnets); false for private subnets behind a NAT gateway."
  type        = bool
  default     = true
}

variable "job_store_access" {
  description = "How jobs reach the bucket: `identity` (the job role reads and writes it; works when jobs cannot reach the control plane, e.g. a laptop behind NAT) or `grants` (no storage permission; URLs the control plane signs, asked for over its callback URL, which jobs must reach)."
  type        = string
  default     = "identity"
  validation {
    condition     = contains(["identity", "grants"], var.job_store_access)
    error_message = "job_store_access: identity or grants."
  }
}

variable "max_vcpus" {
  description = "Most vCPUs the jobs use at once (the Fargate compute environment's cap)."
  type        = number
  default     = 16
}

variable "log_retention_days" {
  description = "How long CloudWatch keeps the jobs' logs."
  type        = number
  default     = 365
}

variable "ecr_repository_arns" {
  description = "ECR repositories to allow pulls from besides those of the images themselves (each ECR image URI's repository is granted already)."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}

variable "kms_key_arn" {
  description = "A customer-managed KMS key to encrypt the bucket and the jobs' log group with (its policy must let CloudWatch Logs use it); null: S3's and CloudWatch's own encryption, nothing billed while idle."
  type        = string
  default     = null
}

variable "bucket_name" {
  description = "The bucket's name; null: `<name>-objects-` and a suffix AWS makes unique."
  type        = string
  default     = null
}

variable "force_destroy" {
  description = "Whether `terraform destroy` may delete the bucket with task objects still in it."
  type        = bool
  default     = true
}
