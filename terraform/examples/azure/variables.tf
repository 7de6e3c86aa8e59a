variable "subscription_id" {
  description = "Azure subscription to deploy into."
  type        = string
  validation {
    condition     = can(regex("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", var.subscription_id))
    error_message = "subscription_id: a subscription GUID."
  }
}

variable "location" {
  description = "Azure region (e.g. westeurope); it must offer Container Apps and zone-redundant PostgreSQL."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9]+$", var.location))
    error_message = "location: a region name such as westeurope."
  }
}

variable "resource_group_name" {
  description = "Resource group made for the deployment."
  type        = string
  default     = "controlplane"
  validation {
    condition     = can(regex("^[-\\w._()]{1,90}$", var.resource_group_name))
    error_message = "resource_group_name: 1 to 90 letters, digits, '-', '_', '.', '(' or ')'."
  }
}

variable "name" {
  description = "Prefix of every resource's name."
  type        = string
  default     = "controlplane"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 12
    error_message = "name: 2 to 12 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "catalog_file" {
  description = "Path of the catalog as `controlplane catalog export` wrote it (JSON or YAML)."
  type        = string
  validation {
    condition     = fileexists(var.catalog_file)
    error_message = "catalog_file: no such file; write it with `controlplane catalog export CATALOG -o FILE`."
  }
}

variable "control_plane_image" {
  description = "The control plane's image, e.g. <registry>.azurecr.io/controlplane:0.1.0."
  type        = string
  validation {
    condition     = length(trimspace(var.control_plane_image)) > 0
    error_message = "control_plane_image: required."
  }
}

variable "registry" {
  description = "The Azure Container Registry holding the images ({ server = \"<name>.azurecr.io\", id = \"<resource id>\" }); null for public images."
  type = object({
    server = string
    id     = string
  })
  default = null
}

variable "oauth" {
  description = "The identity provider (README: Authorization), e.g. Entra ID: { issuer = \"https://login.microsoftonline.com/<tenant>/v2.0\", extra_audiences = [\"<api client id>\"], scope_request_prefix = \"api://<api client id>/\", required_claims = { tid = \"<tenant>\" } }."
  type        = any # the attributes of the module's `oauth` (its README); checked there
  validation {
    condition     = startswith(try(var.oauth.issuer, ""), "https://")
    error_message = "oauth.issuer: the identity provider's issuer URL (https://...)."
  }
}

variable "deletion_protection" {
  description = "A delete lock on the database and Key Vault purge protection; set false and apply before `terraform destroy`."
  type        = bool
  default     = true
}
