"""``python -m mujou``: see :mod:`mujou._info`."""

import sys

from ._info import main

sys.exit(main(sys.argv[1:]))
