"""Worked training examples on shardload stores: models (MLP, GNN, LSTM), normalisation from
the manifest's statistics, radiation metrics and the ``shardload train`` command.

Everything here imports torch (the torch layer); Lightning and PyTorch Geometric are imported
only by the modules that need them.
"""

#: the checkpoint a run keeps current in its folder, which ``--resume`` continues from (here, so
#: that ``shardload train`` checks for it without importing Lightning)
CHECKPOINT_NAME = "last.ckpt"
