"""Training and evaluating one run: the LightningModule, the fit, the protocol, precision, devices, tuning, verify."""
