import torch

lib = torch.library.Library("npugraph_ex", "FRAGMENT")
