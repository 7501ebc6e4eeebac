"""``python -m toolfault`` runs the ``toolfault`` command (:mod:`toolfault._main`)."""

import sys

from toolfault._main import main

sys.exit(main())
