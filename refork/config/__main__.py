"""`python -m refork.config --doc | --write-doc [FILE]`: print or update the generated options table."""

import sys

from refork.config.docs import main

sys.exit(main(sys.argv[1:]))
