"""`python -m healthd ...`: the same as the `healthd` command."""

import sys

from healthd.cli import main

sys.exit(main())
