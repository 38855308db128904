"""`python -m gcl.cluster`: see gcl.cluster.cli."""
import sys

from gcl.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
