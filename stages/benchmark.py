"""Stage benchmark@<name>: turn a prepared source into a benchmark on disk."""
import sys

from gcl.config import load_params, read_current, resolve_benchmark
from gcl.core.layout import benchmark_file, resolved_benchmark, source_file
from gcl.data.benchmarks import build_benchmark
from gcl.data.sources import load_source


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python stages/benchmark.py <benchmark>   (a key of benchmarks: in params.yaml)")
    name = sys.argv[1]
    current = {"data": resolve_benchmark(load_params(), name)["data"]}
    data = read_current(resolved_benchmark(name), current, f"benchmarks.{name}", f"benchmark@{name}")["data"]
    print(build_benchmark(data, load_source(source_file(data["source"])), benchmark_file(name).parent))


if __name__ == "__main__":
    main()
