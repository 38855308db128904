"""The training loop: the stream loop of one seed (train), one run's seeds (run), evaluation, checkpoints and
progress lines. Part of the code whose digest every train stage's settings carry (gcl.core.layout.TRAIN_CODE)."""
