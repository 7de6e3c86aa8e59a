output "mcp_url" {
  description = "The MCP endpoint agents connect to."
  value       = module.settings.mcp_url
}

output "oauth" {
  description = "What to configure in MCP clients and the identity provider: the resource (token audience), the protected resource metadata URL, the scopes."
  value       = module.settings.oauth
}

output "load_balancer_dns_name" {
  description = "Point public_hostname here (a CNAME or alias) when route53_zone_id is not set."
  value       = aws_lb.this.dns_name
}

output "jobs" {
  description = "Tool -> the Batch job definition made for it, as applied (read by `controlplane catalog check`)."
  value       = module.jobs.jobs
}

output "catalog_sha256" {
  description = "Digest of the catalog the server was given (CONTROLPLANE_CATALOG_JSON)."
  value       = module.settings.catalog_sha256
}

output "migrate_command" {
  description = "Runs the migration (`controlplane db upgrade`) by hand, e.g. ahead of a rollout; not needed otherwise: each new revision migrates at start."
  value = join(" ", [
    "aws ecs run-task --region ${local.region} --cluster ${aws_ecs_cluster.this.name}",
    "--task-definition ${aws_ecs_task_definition.migrate.arn} --launch-type FARGATE",
    # no quotes and no spaces: run as `$(terraform output -raw migrate_command)`, the shell splits
    # the words but keeps quotes, which the AWS CLI would then refuse
    "--network-configuration awsvpcConfiguration={subnets=[${join(",", var.private_subnet_ids)}],securityGroups=[${aws_security_group.service.id}],assignPublicIp=DISABLED}",
  ])
}

output "bucket" {
  description = "The object store's bucket."
  value       = module.jobs.bucket.name
}
