"""TorchAir patches ``torch.distributed.all_gather`` here for torch < 2.3; with torch >= 2.3 Dynamo
traces the collectives itself, so the emulator leaves them as they are."""
from torchair.ge_concrete_graph._compat import warn

warn()
