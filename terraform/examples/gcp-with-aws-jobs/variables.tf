variable "project" {
  description = "Google Cloud project id."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project: a project id (6 to 30 lowercase letters, digits or hyphens)."
  }
}

variable "region" {
  description = "Region of everything (e.g. europe-west1)."
  type        = string
  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]$", var.region))
    error_message = "region: a Google Cloud region such as europe-west1."
  }
}

variable "name" {
  description = "Prefix of every resource's name."
  type        = string
  default     = "controlplane"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 20
    error_message = "name: 2 to 20 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
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
  description = "The control plane's image in Artifact Registry, e.g. <region>-docker.pkg.dev/<project>/<repo>/controlplane:0.1.0."
  type        = string
  validation {
    condition     = length(trimspace(var.control_plane_image)) > 0
    error_message = "control_plane_image: required."
  }
}

variable "network" {
  description = "Self link (or projects/<p>/global/networks/<n>) of the VPC network for the database's private IP."
  type        = string
  validation {
    condition     = can(regex("networks/[a-z0-9-]+$", var.network))
    error_message = "network: a VPC network's self link or id."
  }
}

variable "subnetwork" {
  description = "Self link of a subnetwork of `network` in `region`, for the service's Direct VPC egress."
  type        = string
  validation {
    condition     = can(regex("subnetworks/[a-z0-9-]+$", var.subnetwork))
    error_message = "subnetwork: a subnetwork's self link or id."
  }
}

variable "public_hostname" {
  description = "A custom domain you map to the service; null for its run.app URL."
  type        = string
  default     = null
}

variable "oauth" {
  description = "The identity provider (README: Authorization), e.g. Google: { issuer = \"https://accounts.google.com\", issuer_aliases = [\"accounts.google.com\"], extra_audiences = [\"<client id>\"], implicit_scopes = [\"tasks:submit\", \"tasks:read\", \"tasks:cancel\"], required_claims = { hd = \"example.com\" } }."
  type        = any # the attributes of the module's `oauth` (its README); checked there
  validation {
    condition     = startswith(try(var.oauth.issuer, ""), "https://")
    error_message = "oauth.issuer: the identity provider's issuer URL (https://...)."
  }
}

variable "deletion_protection" {
  description = "Protect the database and the service from deletion; set false and apply before `terraform destroy`."
  type        = bool
  default     = true
}

variable "create_private_service_access" {
  description = "Reserve a range and peer `network` with Google's services (Cloud SQL's private IP); false when the network has private service access already (a second peering would fail)."
  type        = bool
  default     = true
}

variable "aws_region" {
  description = "AWS region of the Batch jobs (e.g. us-east-1)."
  type        = string
  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.aws_region))
    error_message = "aws_region: an AWS region such as us-east-1."
  }
}

variable "aws_vpc_id" {
  description = "The AWS VPC the Batch jobs run in (the default VPC will do)."
  type        = string
  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.aws_vpc_id))
    error_message = "aws_vpc_id: a VPC id (vpc-...)."
  }
}

variable "aws_subnet_ids" {
  description = "Subnets of aws_vpc_id with a route to the internet (the default VPC's public subnets): the jobs call the control plane's URL."
  type        = list(string)
  validation {
    condition     = length(var.aws_subnet_ids) >= 1
    error_message = "aws_subnet_ids: at least one subnet."
  }
}

variable "aws_access_key_secret" {
  description = "Secret Manager secret (id) holding the access key id of the IAM user the control plane calls AWS Batch as."
  type        = string
  validation {
    condition     = length(trimspace(var.aws_access_key_secret)) > 0
    error_message = "aws_access_key_secret: required."
  }
}

variable "aws_secret_key_secret" {
  description = "Secret Manager secret (id) holding that user's secret access key."
  type        = string
  validation {
    condition     = length(trimspace(var.aws_secret_key_secret)) > 0
    error_message = "aws_secret_key_secret: required."
  }
}

variable "patience_s" {
  description = "How long a tool's Cloud Run job may wait to start before its attempt moves to AWS Batch."
  type        = number
  default     = 600
}
