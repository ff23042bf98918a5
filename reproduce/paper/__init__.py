"""What the paper defines: the model (section 3), optimisation (5.3-5.4), decoding, BPE, BLEU,
FLOPs, and parsing as translation (6.3). Plain PyTorch; nothing here trains or reads records."""
