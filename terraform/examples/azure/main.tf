# A minimal root module: the control plane on Azure in a resource group and VNet of its own.
#
#   controlplane catalog export catalog.toml --default-image <tools image> -o catalog.json
#   terraform init && terraform apply -var-file=my.tfvars
#   terraform output -json | controlplane catalog check catalog.toml - --default-image <tools image>

provider "azurerm" {
  subscription_id     = var.subscription_id
  storage_use_azuread = true # the storage account has no shared keys
  features {
    resource_group {
      prevent_deletion_if_contains_resources = true
    }
  }
}

module "controlplane" {
  source = "../../modules/azure"

  name                = var.name
  location            = var.location
  resource_group_name = var.resource_group_name
  catalog             = file(var.catalog_file)
  control_plane_image = var.control_plane_image
  registry            = var.registry
  oauth               = var.oauth
  deletion_protection = var.deletion_protection
}
