"""The code a train stage runs besides the methods and the data: the stream loop (train), one run's seeds
(run), the networks (backbones), the buffer, evaluation, checkpoints, progress lines, devices and the resume
fingerprint. One folder, so that a train stage depends on it as one dependency."""
