"""`python -m rollout8.node.accept_npu`: runner.main."""

import sys

from .runner import main

sys.exit(main())
