"""The bottom layer: what every other part of the library stands on, importing nothing of it.

Settings declarations (settings), user errors (errors), atomic writes (atomic), the on-disk layout (layout),
run locks and worker processes (processes), code and settings digests (fingerprint), devices (devices), the
replay buffer (buffer) and the networks (backbones). Layers above, each importing only those below:
data and report (settings, tables, figures), then methods, then training (the stream loop and one run's
seeds), then config (params.yaml validated and resolved), describe and warm; the stage scripts on top."""
