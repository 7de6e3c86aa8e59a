variable "name" {
  description = "Prefix of every resource's name (lowercase letters and digits, and hyphens; job names must stay within Azure's 32 characters)."
  type        = string
  default     = "controlplane"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 12
    error_message = "name: 2 to 12 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "location" {
  description = "Azure region."
  type        = string
}

variable "resource_group_name" {
  description = "Resource group made for the deployment."
  type        = string
}

variable "catalog" {
  description = "The tool catalog as `controlplane catalog export` writes it (JSON or YAML text): one Container Apps job is made per tool. Tools run on the Consumption profile: cpu 0.25 to 4 in steps of 0.25 with 2 GiB per vCPU."
  type        = string
}

variable "control_plane_image" {
  description = "The control plane's image (infra/controlplane/Dockerfile), by tag or digest."
  type        = string
}

variable "registry" {
  description = "An Azure Container Registry the images come from (its login server and resource id): the identities get AcrPull on it. null for public images."
  type = object({
    server = string
    id     = string
  })
  default = null
}

variable "address_space" {
  description = "Address space of the virtual network made for the deployment (a /22 or larger: a /23 for Container Apps, a /24 for the database)."
  type        = string
  default     = "10.42.0.0/22"
}

variable "public_hostname" {
  description = "A custom domain bound to the control plane's container app (you bind it and its certificate); null to use the app's default azurecontainerapps.io name."
  type        = string
  default     = null
}

variable "oauth" {
  description = "The identity provider clients bring access tokens from (README: Authorization); attributes map onto CONTROLPLANE_AUTH_* (issuer_aliases: ..._ISSUER_ALIASES, and so on). Entra ID: scope_request_prefix api://<client id>/, extra_audiences [<client id>]."
  type        = any # an object of the attributes listed in the README, typed and defaulted by ../settings
  validation {
    # Terraform drops attributes an object type does not name, silently: refuse them here instead
    condition = alltrue([for k in keys(var.oauth) : contains(["issuer", "issuer_aliases", "jwks_uri", "audience",
      "extra_audiences", "audience_claim", "scope_request_prefix", "required_claims", "implicit_scopes", "team_claim",
    "scopes", "authorization_servers", "algorithm"], k)])
    error_message = "oauth: an attribute the modules do not know (see the module README for the list); it would be dropped silently."
  }
}

variable "min_replicas" {
  description = "Replicas kept running (1: the scheduler and reconciler always run)."
  type        = number
  default     = 1
}

variable "max_replicas" {
  description = "Most replicas of the control plane."
  type        = number
  default     = 4
}

variable "db_sku" {
  description = "SKU of the PostgreSQL Flexible Server."
  type        = string
  default     = "GP_Standard_D2ds_v5"
}

variable "db_high_availability" {
  description = "A zone-redundant standby for the database."
  type        = bool
  default     = true
}

variable "log_retention_days" {
  description = "How long Log Analytics keeps the service's and the jobs' logs."
  type        = number
  default     = 90
}

variable "deletion_protection" {
  description = "A delete lock on the database server, and purge protection on the Key Vault (a purged vault name stays reserved for its retention)."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}

variable "rbac_propagation_wait" {
  description = "How long the first apply waits after making role assignments before the apps and jobs that use them (Key Vault secrets, image pulls): Azure RBAC takes minutes to propagate."
  type        = string
  default     = "180s"
}
