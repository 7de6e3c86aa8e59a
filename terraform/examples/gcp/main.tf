# A minimal root module: the control plane on Google Cloud in an existing VPC network.
#
#   controlplane catalog export catalog.toml --default-image <tools image> -o catalog.json
#   terraform init && terraform apply -var-file=my.tfvars
#   terraform output -json | controlplane catalog check catalog.toml - --default-image <tools image>

provider "google" {
  project = var.project
  region  = var.region
}

module "controlplane" {
  source = "../../modules/gcp"

  name                = var.name
  project             = var.project
  region              = var.region
  catalog             = file(var.catalog_file)
  control_plane_image = var.control_plane_image
  network             = var.network
  subnetwork          = var.subnetwork

  create_private_service_access = var.create_private_service_access
  public_hostname     = var.public_hostname
  oauth               = var.oauth
  deletion_protection = var.deletion_protection
}
