import torch

lib = torch.library.Library("air", "FRAGMENT")  # noqa: TOR901
