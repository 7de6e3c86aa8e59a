# The control plane on AWS: ECS Fargate behind an HTTPS load balancer, RDS PostgreSQL, CloudWatch
# logs and Secrets Manager, all encrypted with one customer-managed KMS key; its jobs (AWS Batch on
# Fargate, one job definition per catalog tool, the bucket, the jobs' roles) are modules/aws-jobs'.
# IAM is in iam.tf; moved.tf keeps deployments made before the split in place.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account   = data.aws_caller_identity.current.account_id
  region    = data.aws_region.current.region # `name` is deprecated in hashicorp/aws 6.x
  partition = data.aws_partition.current.partition

  public_url  = "https://${var.public_hostname}"
  bucket_name = "${var.name}-objects-${local.account}-${local.region}"
  tags        = merge({ "controlplane:deployment" = var.name }, var.tags)

  server_env = merge(module.settings.environment, {
    CONTROLPLANE_OBJECT_STORE_URL = "s3://${module.jobs.bucket.name}"
    CONTROLPLANE_AWS_BATCH_REGION = local.region
  })
}

# The catalog drives the jobs: one job definition per tool (modules/aws-jobs), and the server's
# catalog points each tool at its own.
module "jobs" {
  source              = "../aws-jobs"
  name                = var.name
  catalog             = var.catalog
  vpc_id              = var.vpc_id
  subnet_ids          = var.private_subnet_ids
  assign_public_ip    = false
  job_store_access    = "grants" # as the settings module tells the server
  max_vcpus           = var.batch_max_vcpus
  log_retention_days  = var.log_retention_days
  ecr_repository_arns = var.ecr_repository_arns
  kms_key_arn         = aws_kms_key.this.arn
  bucket_name         = local.bucket_name
  force_destroy       = !var.deletion_protection
  tags                = var.tags
}

module "settings" {
  source           = "../settings"
  name             = var.name
  catalog          = var.catalog
  provider_name    = "aws_batch"
  provider_options = module.jobs.provider_options
  oauth            = var.oauth
  public_url       = local.public_url
}

# ---- encryption --------------------------------------------------------------------------------
resource "aws_kms_key" "this" {
  description         = "${var.name}: the control plane's data (S3, RDS, logs, secrets)"
  enable_key_rotation = true
  policy              = data.aws_iam_policy_document.kms.json
  tags                = local.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}

# ---- logs --------------------------------------------------------------------------------------
resource "aws_cloudwatch_log_group" "service" {
  name              = "/ecs/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.this.arn
  tags              = local.tags
}

# ---- network -----------------------------------------------------------------------------------
resource "aws_security_group" "alb" {
  name        = "${var.name}-alb"
  description = "HTTPS from clients to the control plane's load balancer"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "alb_https" {
  for_each          = toset(var.allowed_cidrs)
  security_group_id = aws_security_group.alb.id
  description       = "HTTPS from clients"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "alb_to_service" {
  security_group_id            = aws_security_group.alb.id
  description                  = "To the control plane's tasks"
  referenced_security_group_id = aws_security_group.service.id
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
}

resource "aws_security_group" "service" {
  name        = "${var.name}-service"
  description = "The control plane's tasks"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "service_from_alb" {
  security_group_id            = aws_security_group.service.id
  description                  = "From the load balancer"
  referenced_security_group_id = aws_security_group.alb.id
  ip_protocol                  = "tcp"
  from_port                    = 8080
  to_port                      = 8080
}

resource "aws_vpc_security_group_egress_rule" "service_https" {
  security_group_id = aws_security_group.service.id
  description       = "AWS APIs, the image registry and the identity provider's JWKS"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "service_db" {
  security_group_id            = aws_security_group.service.id
  description                  = "The database"
  referenced_security_group_id = aws_security_group.db.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_security_group" "db" {
  name        = "${var.name}-db"
  description = "The PostgreSQL database: reachable from the control plane's tasks only"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_vpc_security_group_ingress_rule" "db_from_service" {
  security_group_id            = aws_security_group.db.id
  description                  = "From the control plane (its service and the migration task)"
  referenced_security_group_id = aws_security_group.service.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

# ---- database ----------------------------------------------------------------------------------
resource "random_password" "db" {
  length  = 40
  special = false # it is part of a URL
}

resource "random_password" "secret_key" {
  length  = 64
  special = false
}

resource "aws_db_subnet_group" "this" {
  name       = var.name
  subnet_ids = var.private_subnet_ids
  tags       = local.tags
}

resource "aws_db_parameter_group" "this" {
  name   = "${var.name}-pg16"
  family = "postgres16"
  tags   = local.tags
  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }
  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }
}

resource "aws_db_instance" "this" {
  #checkov:skip=CKV_AWS_161:The control plane connects with a password kept in Secrets Manager; IAM database auth would need token refresh in its connection pool, which it does not have.
  identifier                            = var.name
  engine                                = "postgres"
  engine_version                        = "16"
  instance_class                        = var.db_instance_class
  allocated_storage                     = var.db_allocated_storage_gb
  storage_type                          = "gp3"
  storage_encrypted                     = true
  kms_key_id                            = aws_kms_key.this.arn
  db_name                               = "controlplane"
  username                              = "controlplane"
  password                              = random_password.db.result
  db_subnet_group_name                  = aws_db_subnet_group.this.name
  parameter_group_name                  = aws_db_parameter_group.this.name
  vpc_security_group_ids                = [aws_security_group.db.id]
  publicly_accessible                   = false
  multi_az                              = var.db_multi_az
  backup_retention_period               = 7
  copy_tags_to_snapshot                 = true
  deletion_protection                   = var.deletion_protection
  skip_final_snapshot                   = !var.deletion_protection
  final_snapshot_identifier             = "${var.name}-final"
  auto_minor_version_upgrade            = true
  enabled_cloudwatch_logs_exports       = ["postgresql", "upgrade"]
  performance_insights_enabled          = true
  performance_insights_kms_key_id       = aws_kms_key.this.arn
  performance_insights_retention_period = 7
  monitoring_interval                   = 60
  monitoring_role_arn                   = aws_iam_role.rds_monitoring.arn
  tags                                  = local.tags
}

resource "aws_secretsmanager_secret" "database_url" {
  #checkov:skip=CKV2_AWS_57:The URL embeds the password RDS was created with; rotate by changing random_password.db and applying (the service restarts with the new value).
  name                    = "${var.name}/database-url"
  description             = "CONTROLPLANE_DATABASE_URL of the control plane"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret_version" "database_url" {
  secret_id     = aws_secretsmanager_secret.database_url.id
  secret_string = "postgresql://controlplane:${random_password.db.result}@${aws_db_instance.this.address}:${aws_db_instance.this.port}/controlplane?sslmode=require"
}

resource "aws_secretsmanager_secret" "secret_key" {
  #checkov:skip=CKV2_AWS_57:The key signs artifact links and runner secrets of tasks in flight; rotating it invalidates them, so it is rotated by replacing random_password.secret_key deliberately.
  name                    = "${var.name}/secret-key"
  description             = "CONTROLPLANE_SECRET_KEY: signs artifact links and runner credentials, shared by every replica"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret_version" "secret_key" {
  secret_id     = aws_secretsmanager_secret.secret_key.id
  secret_string = random_password.secret_key.result
}

# ---- the control plane on ECS Fargate -------------------------------------------------------------
resource "aws_ecs_cluster" "this" {
  name = var.name
  setting {
    name  = "containerInsights"
    value = "enabled"
  }
  tags = local.tags
}

locals {
  server_container = {
    name      = "controlplane"
    image     = var.control_plane_image
    essential = true
    portMappings = [{ containerPort = 8080, protocol = "tcp" }]
    environment  = [for k, v in local.server_env : { name = k, value = v }]
    secrets = [
      { name = "CONTROLPLANE_DATABASE_URL", valueFrom = aws_secretsmanager_secret.database_url.arn },
      { name = "CONTROLPLANE_SECRET_KEY", valueFrom = aws_secretsmanager_secret.secret_key.arn },
    ]
    readonlyRootFilesystem = true
    mountPoints = [
      { sourceVolume = "home", containerPath = "/home/controlplane/.controlplane", readOnly = false },
      { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
    ]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        "awslogs-group"         = aws_cloudwatch_log_group.service.name
        "awslogs-region"        = local.region
        "awslogs-stream-prefix" = "server"
      }
    }
  }
}

resource "aws_ecs_task_definition" "server" {
  family                   = "${var.name}-server"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory_mb
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.server.arn
  container_definitions    = jsonencode([local.server_container])
  volume {
    name = "home"
  }
  volume {
    name = "tmp"
  }
  tags = local.tags
}

# The migration by hand: the same image and settings, running `controlplane db upgrade` (the
# `migrate_command` output), e.g. ahead of a rollout. Not needed for one: each new task migrates
# when it starts, under PostgreSQL's advisory lock, before it listens (CONTROLPLANE_MIGRATE_ON_START).
resource "aws_ecs_task_definition" "migrate" {
  family                   = "${var.name}-migrate"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = 256
  memory                   = 512
  execution_role_arn       = aws_iam_role.execution.arn
  container_definitions = jsonencode([merge(local.server_container, {
    name         = "migrate"
    command      = ["controlplane", "db", "upgrade"]
    portMappings = []
    logConfiguration = merge(local.server_container.logConfiguration, {
      options = merge(local.server_container.logConfiguration.options, { "awslogs-stream-prefix" = "migrate" })
    })
  })])
  volume {
    name = "home"
  }
  volume {
    name = "tmp"
  }
  tags = local.tags
}

resource "aws_ecs_service" "server" {
  name            = var.name
  cluster         = aws_ecs_cluster.this.id
  task_definition = aws_ecs_task_definition.server.arn
  desired_count   = var.desired_count
  launch_type     = "FARGATE"
  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.service.id]
    assign_public_ip = false
  }
  load_balancer {
    target_group_arn = aws_lb_target_group.server.arn
    container_name   = "controlplane"
    container_port   = 8080
  }
  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
  # A new task migrates the database before it listens (CONTROLPLANE_MIGRATE_ON_START): the load
  # balancer's failed checks meanwhile do not count against it.
  health_check_grace_period_seconds = 120
  propagate_tags = "SERVICE"
  tags           = local.tags
  depends_on     = [aws_lb_listener.https]
}

# ---- load balancer ---------------------------------------------------------------------------------
resource "aws_lb" "this" {
  #checkov:skip=CKV_AWS_91:Requests are logged by the control plane itself (its audit of every task act); an ALB access log would need a separate unencrypted-by-KMS bucket (ALB logs support SSE-S3 only).
  #checkov:skip=CKV2_AWS_28:A WAF is the operator's choice (and cost); MCP clients authenticate with OAuth tokens checked before anything runs.
  name                       = var.name
  load_balancer_type         = "application"
  internal                   = false
  subnets                    = var.public_subnet_ids
  security_groups            = [aws_security_group.alb.id]
  drop_invalid_header_fields = true
  enable_deletion_protection = var.deletion_protection
  idle_timeout               = 300 # streamed waits send a keep-alive every 15 s; long calls stay open
  tags                       = local.tags
}

resource "aws_lb_target_group" "server" {
  #checkov:skip=CKV_AWS_378:TLS ends at the load balancer; the hop to the tasks stays inside the VPC, in security groups that admit only the load balancer.
  name        = var.name
  port        = 8080
  protocol    = "HTTP"
  target_type = "ip"
  vpc_id      = var.vpc_id
  health_check {
    path    = "/healthz"
    matcher = "200"
  }
  tags = local.tags
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.this.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.certificate_arn
  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.server.arn
  }
  tags = local.tags
}

resource "aws_route53_record" "public" {
  count   = var.route53_zone_id == null ? 0 : 1
  zone_id = var.route53_zone_id
  name    = var.public_hostname
  type    = "A"
  alias {
    name                   = aws_lb.this.dns_name
    zone_id                = aws_lb.this.zone_id
    evaluate_target_health = true
  }
}
