"""The parameter server: embedding tables sharded by rows across servers, pulled and pushed sparsely by
trainers (``sharding`` routes ids, ``table`` holds one server's rows and their optimizer state, ``clicks``
makes and reads click logs).

Imports: errors, rpc, utils; nothing from the LM trainer (train/, plan/, build, models).
"""
