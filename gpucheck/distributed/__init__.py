"""Multi-process checks through ``torch.distributed``: every rank's collective log, the
analysis that names the rank and the collective of a hang, the DDP step and distributed
rendering checks. Importing this package does not import torch."""
