variable "name" {
  description = "Prefix of every resource's name (lowercase letters, digits and hyphens)."
  type        = string
  default     = "controlplane"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 20
    error_message = "name: 2 to 20 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "project" {
  description = "The Google Cloud project id."
  type        = string
}

variable "region" {
  description = "Region of the service, the jobs, the database and the bucket."
  type        = string
}

variable "catalog" {
  description = "The tool catalog as `controlplane catalog export` writes it (JSON or YAML text): one Cloud Run job is made per tool."
  type        = string
}

variable "control_plane_image" {
  description = "The control plane's image (infra/controlplane/Dockerfile) in Artifact Registry, by tag or digest."
  type        = string
}

variable "network" {
  description = "Self link of the VPC network the database gets its private IP in; the service reaches it through Direct VPC egress."
  type        = string
}

variable "subnetwork" {
  description = "Self link of a subnetwork of `network` in `region` for the service's Direct VPC egress."
  type        = string
}

variable "create_private_service_access" {
  description = "Reserve a range and peer `network` with Google's services (Cloud SQL private IP); false if the network has private service access already."
  type        = bool
  default     = true
}

variable "public_hostname" {
  description = "A custom domain mapped to the service (you create the mapping); null to use the service's run.app URL."
  type        = string
  default     = null
}

variable "oauth" {
  description = "The identity provider clients bring access tokens from (README: Authorization); attributes map onto CONTROLPLANE_AUTH_* (issuer_aliases: ..._ISSUER_ALIASES, and so on). Google ID tokens: issuer https://accounts.google.com, issuer_aliases [\"accounts.google.com\"], implicit_scopes."
  type        = any # an object of the attributes listed in the README, typed and defaulted by ../settings
  validation {
    # Terraform drops attributes an object type does not name, silently: refuse them here instead
    condition = alltrue([for k in keys(var.oauth) : contains(["issuer", "issuer_aliases", "jwks_uri", "audience",
      "extra_audiences", "audience_claim", "scope_request_prefix", "required_claims", "implicit_scopes", "team_claim",
    "scopes", "authorization_servers", "algorithm"], k)])
    error_message = "oauth: an attribute the modules do not know (see the module README for the list); it would be dropped silently."
  }
}

variable "min_instances" {
  description = "Instances kept running (1: the scheduler and reconciler always run; tasks launch without a cold start)."
  type        = number
  default     = 1
}

variable "max_instances" {
  description = "Most instances of the service."
  type        = number
  default     = 4
}

variable "db_tier" {
  description = "Cloud SQL machine tier."
  type        = string
  default     = "db-custom-1-3840"
}

variable "db_high_availability" {
  description = "A regional (high-availability) database with a standby in a second zone."
  type        = bool
  default     = true
}

variable "deletion_protection" {
  description = "Protect the database and the service from deletion (turn off before `terraform destroy`)."
  type        = bool
  default     = true
}

variable "labels" {
  description = "Labels on every resource that takes them."
  type        = map(string)
  default     = {}
}

variable "more_placements" {
  description = "Tool -> the placements it may also run on after its Cloud Run job (a list of { provider, provider_options }, e.g. modules/aws-jobs' provider_options on aws_batch): its attempts move there when Cloud Run has no room (examples/gcp-with-aws-jobs)."
  type        = any
  default     = {}
}

variable "patience_s" {
  description = "How long a Cloud Run job of a tool with more_placements may wait to start before its attempt moves to the next placement; null: as long as Cloud Run lets it."
  type        = number
  default     = null
}

variable "environment" {
  description = "More environment for the server, e.g. another cloud's provider settings (CONTROLPLANE_AWS_BATCH_REGION); the module's own settings win over these."
  type        = map(string)
  default     = {}
}

variable "secret_environment" {
  description = "Environment variable -> the Secret Manager secret (id) its value is read from, e.g. another cloud's credentials; the server's account is granted access to each."
  type        = map(string)
  default     = {}
}
