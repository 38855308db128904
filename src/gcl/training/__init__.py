"""The code a train stage runs besides the methods and the data: the stream loop (train), one run's seeds
(run), the networks (backbones), the buffer, evaluation, checkpoints, progress lines, devices and the resume
fingerprint. One folder of the code whose digest every train stage's settings carry (gcl.layout.TRAIN_CODE)."""
