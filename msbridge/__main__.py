"""``python -m msbridge``: the ``msbridge`` command, for a Python whose ``msbridge`` script is not on PATH."""
import sys

from .cli.main import main

sys.exit(main())
