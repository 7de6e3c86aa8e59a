import signal
import sys

# A stop can arrive while the interpreter is still importing the runner (a cancel right after a
# launch): remember it instead of dying without an outcome, and let the runner honour it.
_early: list[str] = []
for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, lambda signum, _frame: _early.append(signal.Signals(signum).name))

from infra.runner.runner import main  # noqa: E402

sys.exit(main(early_signals=_early))
