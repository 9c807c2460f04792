"""Remote procedure calls between named workers (the parameter server, distributed RL).

``transport`` is the only module in disttrain that imports ``torch.distributed.rpc`` (in maintenance mode in
PyTorch: one module keeps a later swap cheap). RPC runs pickled callables: trusted networks only.
Imports: errors only.
"""
