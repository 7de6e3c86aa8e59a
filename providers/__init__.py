"""Job runners behind one interface (`providers.base.Provider`), one module per runner.

Cloud SDKs are imported only inside their own module, and a module is imported only when a
catalog entry names its provider, so the local path never needs a cloud SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.settings import Settings
    from providers.base import Provider

KNOWN = ("local", "aws_batch")


def create_provider(name: str, settings: Settings) -> Provider:
    if name == "local":
        from providers.local import LocalProvider

        return LocalProvider(settings.jobs_dir, python=settings.local_python, kill_grace_s=settings.kill_grace_s)
    if name == "aws_batch":
        try:
            from providers.aws_batch import AwsBatchProvider
        except ImportError as e:
            raise ValueError(f"provider aws_batch needs {e.name}: pip install 'mcp-controlplane[aws]'") from None

        return AwsBatchProvider(region=settings.aws_region, max_tps=settings.aws_batch_max_tps,
                                poll_interval_s=settings.aws_batch_poll_interval_s,
                                stuck_after_s=settings.aws_batch_stuck_after_s, kill_grace_s=settings.kill_grace_s)
    raise ValueError(f"unknown provider '{name}' (known: {', '.join(KNOWN)})")
