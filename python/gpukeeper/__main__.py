"""``python -m gpukeeper``: the same as the ``gpukeeper`` command."""

import sys

from gpukeeper.cli import main

sys.exit(main())
