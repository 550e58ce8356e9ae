"""``python -m hector``: the same command line as the ``hector`` console script."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
