variable "region" {
  description = "AWS region to deploy into."
  type        = string
  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region: an AWS region name such as eu-west-1."
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
  description = "The control plane's image (infra/controlplane/Dockerfile), e.g. <account>.dkr.ecr.<region>.amazonaws.com/controlplane:0.1.0."
  type        = string
  validation {
    condition     = length(trimspace(var.control_plane_image)) > 0
    error_message = "control_plane_image: required."
  }
}

variable "public_hostname" {
  description = "DNS name of the control plane (e.g. mcp.example.com); the MCP URL is https://<public_hostname>/mcp."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$", var.public_hostname))
    error_message = "public_hostname: a DNS name such as mcp.example.com (no scheme, no path)."
  }
}

variable "certificate_arn" {
  description = "ACM certificate covering public_hostname, in the same region."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:acm:", var.certificate_arn))
    error_message = "certificate_arn: an ACM certificate ARN."
  }
}

variable "route53_zone_id" {
  description = "Route 53 hosted zone to create public_hostname in; null to point DNS at the load_balancer_dns_name output yourself."
  type        = string
  default     = null
}

variable "vpc_id" {
  description = "The VPC to deploy into."
  type        = string
  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id: a VPC id (vpc-...)."
  }
}

variable "public_subnet_ids" {
  description = "Two or more public subnets (different AZs) for the load balancer."
  type        = list(string)
  validation {
    condition     = length(var.public_subnet_ids) >= 2
    error_message = "public_subnet_ids: at least two subnets in different availability zones."
  }
}

variable "private_subnet_ids" {
  description = "Two or more private subnets (different AZs, with a NAT gateway) for the service, the jobs and the database."
  type        = list(string)
  validation {
    condition     = length(var.private_subnet_ids) >= 2
    error_message = "private_subnet_ids: at least two subnets in different availability zones."
  }
}

variable "oauth" {
  description = "The identity provider (README: Authorization), e.g. { issuer = \"https://cognito-idp.<region>.amazonaws.com/<pool id>\", audience_claim = \"client_id\", extra_audiences = [\"<app client id>\"] }."
  type        = any # the attributes of the module's `oauth` (its README); checked there
  validation {
    condition     = startswith(try(var.oauth.issuer, ""), "https://")
    error_message = "oauth.issuer: the identity provider's issuer URL (https://...)."
  }
}

variable "deletion_protection" {
  description = "Protect the database and load balancer from deletion; set false and apply before `terraform destroy`."
  type        = bool
  default     = true
}
