"""`python -m refork` is the `refork` command."""

import sys

from refork.cli import main

sys.exit(main())
