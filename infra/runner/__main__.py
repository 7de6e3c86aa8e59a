import sys

from infra.runner.runner import main

sys.exit(main())
