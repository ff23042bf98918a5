"""What the paper defines: the model (section 3), optimisation (5.3-5.4), decoding, BPE, BLEU, FLOPs, parse-tree linearization."""
