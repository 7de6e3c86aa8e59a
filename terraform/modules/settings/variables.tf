variable "name" {
  description = "The deployment's name: job names are <name>-<tool>."
  type        = string
}

variable "catalog" {
  description = "The tool catalog as `controlplane catalog export` writes it (JSON or YAML text)."
  type        = string
  validation {
    condition     = can(try(jsondecode(var.catalog), yamldecode(var.catalog)).jobs) && try(try(jsondecode(var.catalog), yamldecode(var.catalog)).format, 0) == 1
    error_message = "catalog: not the output of `controlplane catalog export` (format 1, with `jobs` and `catalog`)."
  }
}

variable "provider_name" {
  description = "The control plane's provider every tool runs on: aws_batch, cloud_run or container_apps."
  type        = string
  validation {
    condition     = contains(["aws_batch", "cloud_run", "container_apps"], var.provider_name)
    error_message = "provider_name: one of aws_batch, cloud_run, container_apps."
  }
}

variable "provider_options" {
  description = "Tool -> the provider_options that point it at the job made for it (the cloud module's jobs)."
  type        = map(map(string))
}

variable "more_placements" {
  description = "Tool -> the placements it may also run on, after this cloud's (a list of { provider, provider_options }, e.g. another cloud's jobs-only module's provider_options): its attempts move there when this cloud has no room."
  type        = any
  default     = {}
}

variable "patience_s" {
  description = "How long a job of a tool with more_placements may wait to start on this cloud before its attempt moves to the next placement; null: as long as the provider lets it."
  type        = number
  default     = null
}

variable "oauth" {
  description = "The identity provider clients bring access tokens from; attributes map onto CONTROLPLANE_AUTH_*."
  type = object({
    issuer               = string
    issuer_aliases       = optional(list(string), [])
    jwks_uri             = optional(string)
    audience             = optional(string)
    extra_audiences      = optional(list(string), [])
    audience_claim       = optional(string)
    scope_request_prefix = optional(string)
    required_claims      = optional(map(string), {})
    implicit_scopes      = optional(list(string), [])
    team_claim           = optional(string)
    # scope names as they appear in tokens (Cognito: "<resource server>/tasks:submit"), by role
    scopes                = optional(object({ submit = optional(string), read = optional(string), cancel = optional(string), admin = optional(string) }), {})
    authorization_servers = optional(list(string), [])
    algorithm             = optional(string)
  })
  default = null # the jobs-only modules: a control plane on a laptop keeps its own settings
}

variable "public_url" {
  description = "The control plane's public base URL (https://host); the MCP endpoint is <public_url>/mcp. Null for the jobs-only modules."
  type        = string
  default     = null
}
