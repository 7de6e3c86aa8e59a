"""Job runners behind one interface (`controlplane_providers.base.Provider`), one module per runner.

Runners are plug-ins (`controlplane_providers.registry`): the core asks for one by name. A cloud's
pieces beside its provider module live in a package of its own (`aws`, `gcp`, `azure`). Cloud SDKs
are imported only by a runner's module and its package, and those are imported only when a catalog
entry names the provider, so the local path never needs a cloud SDK.
"""
