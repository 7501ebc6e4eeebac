"""``python -m toolfault`` runs the CLI."""

import sys

from toolfault._cli import main

sys.exit(main())
