# What every cloud module gives the control plane, written once: the jobs the operator's catalog
# asks for, the catalog the server is given (each tool pointed at the job made for it), and the
# CONTROLPLANE_* environment. No cloud resources: the cloud modules make those.

locals {
  exported = try(jsondecode(var.catalog), yamldecode(var.catalog))

  # The catalog drives the jobs: one job per tool, named after it (lowercased, '_' -> '-').
  jobs      = local.exported.jobs
  job_names = { for tool, job in local.jobs : tool => "${var.name}-${replace(lower(tool), "_", "-")}" }

  wait_options = ["stuck_after_s", "on_stuck"] # provider_options that are not about where a job runs
  # Each tool's placement on the jobs this module's cloud made for it; a tool with more places
  # to run (`more_placements`, e.g. another cloud's jobs-only module) lists them after it, its
  # own placement waiting `patience_s` for a job to start before the attempt moves on.
  own_placement = { for tool, spec in local.exported.catalog.tools : tool => {
    provider = var.provider_name
    provider_options = merge(
      { for k, v in try(spec.provider_options, {}) : k => v if contains(local.wait_options, k) },
      var.provider_options[tool],
    )
  } }
  patience = { for k, v in { patience_s = var.patience_s } : k => v if v != null }
  server_catalog = merge(local.exported.catalog, {
    resource_classes = { for rc_name, rc in local.exported.catalog.resource_classes :
    rc_name => merge(rc, { provider_options = {} }) }
    # (as JSON both ways: a tool with placements and one without are objects of different types)
    tools = { for tool, spec in local.exported.catalog.tools : tool => jsondecode(contains(keys(var.more_placements), tool)
      ? jsonencode(merge({ for k, v in spec : k => v if !contains(["provider", "provider_options"], k) }, {
        placements = concat([merge(local.own_placement[tool], local.patience)], var.more_placements[tool])
      }))
    : jsonencode(merge(spec, local.own_placement[tool]))) }
  })

  mcp_url = var.public_url == null ? null : "${var.public_url}/mcp"
  # Host names (ports aside) the server answers besides its public URL's: load balancers' and the
  # platforms' health probes address a replica by its private IP, which the DNS-rebinding guard
  # would otherwise refuse (421). Patterns: the RFC 1918 ranges and link-local.
  probe_hosts = "10.*,172.1[6-9].*,172.2[0-9].*,172.3[01].*,192.168.*,169.254.*"
  auth_env = var.oauth == null ? {} : merge(
    {
      CONTROLPLANE_AUTH_ISSUER          = var.oauth.issuer
      CONTROLPLANE_AUTH_ISSUER_ALIASES  = join(",", var.oauth.issuer_aliases)
      CONTROLPLANE_AUTH_EXTRA_AUDIENCES = join(",", var.oauth.extra_audiences)
      CONTROLPLANE_AUTH_REQUIRED_CLAIMS = join(",", [for k, v in var.oauth.required_claims : "${k}=${v}"])
      CONTROLPLANE_AUTH_IMPLICIT_SCOPES = join(",", var.oauth.implicit_scopes)
    },
    var.oauth.jwks_uri == null ? {} : { CONTROLPLANE_AUTH_JWKS_URI = var.oauth.jwks_uri },
    var.oauth.audience == null ? {} : { CONTROLPLANE_AUTH_AUDIENCE = var.oauth.audience },
    var.oauth.audience_claim == null ? {} : { CONTROLPLANE_AUTH_AUDIENCE_CLAIM = var.oauth.audience_claim },
    var.oauth.scope_request_prefix == null ? {} : { CONTROLPLANE_AUTH_SCOPE_REQUEST_PREFIX = var.oauth.scope_request_prefix },
    var.oauth.team_claim == null ? {} : { CONTROLPLANE_AUTH_TEAM_CLAIM = var.oauth.team_claim },
    var.oauth.algorithm == null ? {} : { CONTROLPLANE_AUTH_ALGORITHM = var.oauth.algorithm },
    length(var.oauth.authorization_servers) == 0 ? {} : { CONTROLPLANE_AUTH_AUTHORIZATION_SERVERS = join(",", var.oauth.authorization_servers) },
    { for role, scope in var.oauth.scopes : "CONTROLPLANE_AUTH_SCOPE_${upper(role)}" => scope if scope != null },
  )
  scopes = [for role in ["submit", "read", "cancel", "admin"] : try(coalesce(var.oauth.scopes[role], "tasks:${role}"), "tasks:${role}")]
}
