"""Job runners behind one interface (`controlplane_providers.base.Provider`), one module per runner.

Runners are plug-ins (`controlplane_providers.registry`): the core asks for one by name. Cloud SDKs are
imported only inside their own module, and a module is imported only when a catalog entry names
its provider, so the local path never needs a cloud SDK.
"""
