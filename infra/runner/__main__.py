import signal
import sys

# A stop can arrive while the interpreter is still importing the runner (a cancel right after a
# launch): remember it instead of dying without an outcome, and let the runner honour it.
_early: list[str] = []
for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, lambda signum, _frame: _early.append(signal.Signals(signum).name))

from controlplane_runner.claim import claim_from_argv  # noqa: E402

claim_from_argv(sys.argv[1:])  # a second runner of one job exits here, before it reads or runs anything

from controlplane_runner.runner import main  # noqa: E402

sys.exit(main(early_signals=_early))
