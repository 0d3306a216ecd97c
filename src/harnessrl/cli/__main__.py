"""`python -m harnessrl.cli`: the same command line as the `harnessrl` script."""

import sys

from harnessrl.cli import main

sys.exit(main())
