"""``python -m toolfault_cli`` runs the command line (as ``toolfault`` does)."""

import sys

from toolfault_cli._cli import main

sys.exit(main())
