variable "name" {
  description = "Prefix of every resource's name (lowercase letters, digits and hyphens)."
  type        = string
  default     = "controlplane"
  validation {
    condition     = can(regex("^[a-z](-?[a-z0-9])+$", var.name)) && length(var.name) <= 20
    error_message = "name: 2 to 20 lowercase letters, digits or single hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "catalog" {
  description = "The tool catalog as `controlplane catalog export` writes it (JSON or YAML text): one Batch job definition is made per tool."
  type        = string
}

variable "control_plane_image" {
  description = "The control plane's image (infra/controlplane/Dockerfile), by tag or digest."
  type        = string
}

variable "public_hostname" {
  description = "The DNS name clients reach the control plane at (the certificate's name); the MCP URL is https://<public_hostname>/mcp."
  type        = string
}

variable "certificate_arn" {
  description = "ACM certificate for public_hostname, used by the load balancer's HTTPS listener."
  type        = string
}

variable "route53_zone_id" {
  description = "Route 53 hosted zone to create public_hostname in (an alias to the load balancer); null to manage DNS yourself."
  type        = string
  default     = null
}

variable "vpc_id" {
  description = "The VPC to deploy into."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets of the internet-facing load balancer (two or more availability zones)."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Subnets without public IPs for the service, the Batch jobs and the database (two or more AZs); they need a NAT gateway or VPC endpoints to reach AWS APIs, the image registry and the load balancer."
  type        = list(string)
}

variable "allowed_cidrs" {
  description = "Networks allowed to reach the HTTPS listener: the clients' and the jobs' (runners call back to the public URL through the NAT gateways: include their public IPs as /32, or the jobs' reports are cut)."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "oauth" {
  description = "The identity provider clients bring access tokens from (README: Authorization); attributes map onto CONTROLPLANE_AUTH_* (issuer_aliases: ..._ISSUER_ALIASES, and so on)."
  type        = any # an object of the attributes listed in the README, typed and defaulted by ../settings
  validation {
    # Terraform drops attributes an object type does not name, silently: refuse them here instead
    condition = alltrue([for k in keys(var.oauth) : contains(["issuer", "issuer_aliases", "jwks_uri", "audience",
      "extra_audiences", "audience_claim", "scope_request_prefix", "required_claims", "implicit_scopes", "team_claim",
    "scopes", "authorization_servers", "algorithm"], k)])
    error_message = "oauth: an attribute the modules do not know (see the module README for the list); it would be dropped silently."
  }
}

variable "desired_count" {
  description = "Control-plane replicas (each one an ECS task; one leads the scheduler, the others serve)."
  type        = number
  default     = 2
}

variable "cpu" {
  description = "vCPU units of a control-plane task (1024 = 1 vCPU)."
  type        = number
  default     = 512
}

variable "memory_mb" {
  description = "Memory of a control-plane task."
  type        = number
  default     = 1024
}

variable "batch_max_vcpus" {
  description = "Most vCPUs the Batch compute environment runs at once (all jobs together)."
  type        = number
  default     = 64
}

variable "db_instance_class" {
  description = "RDS instance class of the PostgreSQL database."
  type        = string
  default     = "db.t4g.small"
}

variable "db_allocated_storage_gb" {
  description = "Storage of the database."
  type        = number
  default     = 20
}

variable "db_multi_az" {
  description = "A standby database in a second availability zone."
  type        = bool
  default     = true
}

variable "deletion_protection" {
  description = "Protect the database and the load balancer from deletion (turn off before `terraform destroy`)."
  type        = bool
  default     = true
}

variable "log_retention_days" {
  description = "How long CloudWatch keeps the service's and the jobs' logs."
  type        = number
  default     = 365
}

variable "ecr_repository_arns" {
  description = "ECR repositories to grant pulls from besides those the module reads from the images' own URIs (every <account>.dkr.ecr.<region>.amazonaws.com image gets its repository's pull access)."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}
