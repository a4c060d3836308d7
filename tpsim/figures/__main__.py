"""``python -m tpsim.figures``: see ``tpsim.figures.cli``."""

import sys

from tpsim.figures.cli import main

sys.exit(main())
