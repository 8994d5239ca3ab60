"""``python -m specserve``: the same entry point as the ``specserve`` command."""

import sys

from specserve.cli import main

if __name__ == "__main__":
    sys.exit(main())
