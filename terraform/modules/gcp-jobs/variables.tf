variable "name" {
  description = "Prefix of every resource's name (lowercase letters, digits and single hyphens)."
  type        = string
  default     = "cp-jobs"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 20
    error_message = "name: 2 to 20 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "project" {
  description = "The Google Cloud project."
  type        = string
}

variable "region" {
  description = "Region of the jobs and the bucket."
  type        = string
}

variable "catalog" {
  description = "The tool catalog as `controlplane catalog export` writes it (JSON or YAML text): one Cloud Run job per tool."
  type        = string
}

variable "operator_member" {
  description = "Who runs the control plane (`user:you@example.com`, `serviceAccount:...`): granted exactly what it needs on these jobs, the bucket, the logs and the link signer. Null: grant it yourself (README)."
  type        = string
  default     = null
}

variable "job_store_access" {
  description = "How jobs reach the bucket: `identity` (the jobs' service account reads and writes it; works when jobs cannot reach the control plane, e.g. a laptop behind NAT) or `grants` (no storage permission; URLs the control plane signs, asked for over its callback URL)."
  type        = string
  default     = "identity"
  validation {
    condition     = contains(["identity", "grants"], var.job_store_access)
    error_message = "job_store_access: identity or grants."
  }
}

variable "labels" {
  description = "Labels on every resource that takes them."
  type        = map(string)
  default     = {}
}

variable "signer" {
  description = "Make a service account that signs artifact links (CONTROLPLANE_GCS_SIGNER_EMAIL), which a control plane on user credentials needs; false where it runs as a service account that signs as itself."
  type        = bool
  default     = true
}

variable "enable_apis" {
  description = "Turn on the Google APIs the jobs need; false where the caller turns them on (and makes the module depend on it)."
  type        = bool
  default     = true
}

variable "force_destroy" {
  description = "Whether `terraform destroy` may delete the bucket with task objects still in it."
  type        = bool
  default     = true
}
