# A minimal root module: the control plane on AWS in an existing VPC.
#
#   controlplane catalog export catalog.toml --default-image <tools image> -o catalog.json
#   terraform init && terraform apply -var-file=my.tfvars
#   terraform output -json | controlplane catalog check catalog.toml - --default-image <tools image>

provider "aws" {
  region = var.region
  default_tags {
    tags = { "controlplane:managed-by" = "terraform" }
  }
}

module "controlplane" {
  source = "../../modules/aws"

  name                = var.name
  catalog             = file(var.catalog_file)
  control_plane_image = var.control_plane_image
  public_hostname     = var.public_hostname
  certificate_arn     = var.certificate_arn
  route53_zone_id     = var.route53_zone_id
  vpc_id              = var.vpc_id
  public_subnet_ids   = var.public_subnet_ids
  private_subnet_ids  = var.private_subnet_ids
  oauth               = var.oauth
  deletion_protection = var.deletion_protection
}
