"""Stage benchmark@<name>: turn a prepared source into a benchmark on disk."""
import sys

from gcl.config import benchmark_file, load_params, source_file
from gcl.data.benchmarks import build_benchmark
from gcl.data.sources import load_source

if __name__ == "__main__":
    name = sys.argv[1]
    cfg = load_params()["benchmarks"][name]
    print(build_benchmark(cfg, load_source(source_file(cfg["source"])), benchmark_file(name).parent))
