variable "name" {
  description = "Prefix of every resource's name (lowercase letters, digits and single hyphens; job names <name>-<tool> must stay within Azure's 32 characters)."
  type        = string
  default     = "cp-jobs"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 12
    error_message = "name: 2 to 12 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "resource_group_name" {
  description = "The resource group to make (everything here goes in it)."
  type        = string
}

variable "location" {
  description = "Azure region of the jobs, their environment and the storage account."
  type        = string
}

variable "catalog" {
  description = "The tool catalog as `controlplane catalog export` writes it (JSON or YAML text): one Container Apps job per tool."
  type        = string
}

variable "operator_object_id" {
  description = "Entra object id of who runs the control plane (`az ad signed-in-user show --query id -o tsv`): granted exactly what it needs on these jobs, the storage and the logs. Null: grant it yourself (README)."
  type        = string
  default     = null
}

variable "job_store_access" {
  description = "How jobs reach the storage: `identity` (each job's identity reads and writes the container; works when jobs cannot reach the control plane, e.g. a laptop behind NAT) or `grants` (no storage role; SAS URLs the control plane signs, asked for over its callback URL)."
  type        = string
  default     = "identity"
  validation {
    condition     = contains(["identity", "grants"], var.job_store_access)
    error_message = "job_store_access: identity or grants."
  }
}

variable "registry" {
  description = "A private Azure Container Registry the tool images come from ({ id, server }); null for public images. Each job's identity gets AcrPull on it."
  type        = object({ id = string, server = string })
  default     = null
}

variable "log_retention_days" {
  description = "How long Log Analytics keeps the jobs' console logs."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}

variable "job_acr_pull" {
  description = "Grant each job's identity AcrPull on `registry` here; false where the caller grants it."
  type        = bool
  default     = true
}

variable "storage_replication" {
  description = "The storage account's replication: LRS (the cheapest), or ZRS to keep task objects through a zone failure."
  type        = string
  default     = "LRS"
  validation {
    condition     = contains(["LRS", "ZRS"], var.storage_replication)
    error_message = "storage_replication: LRS or ZRS."
  }
}
