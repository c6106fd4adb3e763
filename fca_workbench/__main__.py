"""``python -m fca_workbench``: the ``fca`` command line, also what ``torchrun ... -m fca_workbench`` starts."""

import sys

from fca_workbench.cli import main

sys.exit(main())
