"""Stage prepare@<source>: fetch or read one raw data source and save it as tensors."""
import sys

from gcl.config import load_params, source_file
from gcl.data.sources import prepare_source

if __name__ == "__main__":
    name = sys.argv[1]
    params = load_params()
    print(prepare_source(name, params["sources"][name] or {}, source_file(name).parent))
