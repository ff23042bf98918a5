"""Performance side by side: our training step and decoding against the alternatives a user would
otherwise pick, in one process, on the same batches (``python -m reproduce bench``).

Training (forward, label-smoothed loss, backward, Adam step and warm-up schedule), in target tokens
per second and as a fraction of this machine's matmul peak, measured here per precision (model
FLOPs: ``reproduce.paper.flops``, the same count for every contender since they compute the same function):

* ``ours``: ``reproduce.paper.model.Transformer`` with the loss of ``lit.py`` (``optim.output_loss``);
* ``ours, Lightning loop``: the same module driven by a ``Trainer``, as runs train (the loop's own
  cost: hooks, logging, the optimizer call; trainer set-up excluded);
* ``torch.nn.Transformer`` and ``MarianMT`` (``reproduce.speed.peers``), with
  ``F.cross_entropy(label_smoothing=...)``, the same Adam and schedule, our weights copied in;
* ``ours, torch.compile`` with ``--compile``: the same loss function compiled (graphs counted);

each in fp32 and, where bf16 is native, in bf16-mixed, beside the precision a run of the table's
base would take here (``train.precision.choose``: timed steps, never the matmul alone).

Decoding, in sentences per second: our greedy and beam search with and without the key/value cache
(their outputs must be identical, or the command fails) and MarianMT ``generate`` with the same
beam, alpha and maximum length (see ``peers.marian_generate_kwargs`` for what differs).

Noise: contenders run after a warm-up, interleaved: every round runs each contender once, the order
rotating from round to round, so a background load hits all alike. Medians over rounds are
reported, with ratios to ours; the load average before the run is recorded and a run on a loaded
machine is marked as contended.
"""
