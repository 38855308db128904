"""Stage train@<run>: every seed of one table cell; writes runs/<benchmark>/<method>/<buffer>/metrics.json."""
import sys

from gcl.cell import train_cell
from gcl.config import load_params

if __name__ == "__main__":
    print(train_cell(load_params(), sys.argv[1]))
