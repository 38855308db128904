"""Stage prepare@<source>: fetch or read one raw data source (with the reader its `kind` names) and save it as
tensors."""
import sys

from gcl.config import load_params, read_current, resolve_source
from gcl.core.layout import resolved_source, source_file
from gcl.data.sources import prepare_source


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python stages/prepare.py <source>   (a key of sources: in params.yaml)")
    name = sys.argv[1]
    settings = read_current(resolved_source(name), resolve_source(load_params(), name), f"sources.{name}",
                            f"prepare@{name}")
    print(prepare_source(settings.kind, settings, source_file(name).parent))   # its reader: the block's kind


if __name__ == "__main__":
    main()
