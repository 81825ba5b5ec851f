"""``torchair._acl_concrete_graph``: the parts of TorchAir's aclgraph package tests touch."""
