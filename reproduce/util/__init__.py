"""Helpers every layer may use: durable files, log quieting, the machine, secrets, W&B mode."""
