"""``python -m tpsim.trace.figures``: see ``tpsim.trace.figures.cli``."""

import sys

from tpsim.trace.figures.cli import main

sys.exit(main())
