"""CN-DPM (Lee et al., ICLR 2020), in three parts: the method (method: wake, sleep, the mixture's prediction),
its experts (experts: architectures, the VAE loss) and their optimiser (optim). The algorithm and its
departures from the authors' code are described in gcl.methods.cndpm.method."""
from gcl.methods.cndpm.experts import Expert, vae_nll  # noqa: F401
from gcl.methods.cndpm.method import CNDPM, CNDPMSettings, chilled_nll  # noqa: F401
from gcl.methods.cndpm.optim import Adam  # noqa: F401
