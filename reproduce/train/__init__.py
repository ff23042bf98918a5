"""One run trained and evaluated: the LightningModule, the fit, the evaluation protocol,
precision, devices, tuning, and verify."""
