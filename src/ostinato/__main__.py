"""`python -m ostinato`: the console script through the running interpreter (the pipeline's rules use it)."""

import sys

from ostinato.cli import main

sys.exit(main())
