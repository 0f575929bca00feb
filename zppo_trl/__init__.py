"""zppo_trl: Zone of Proximal Policy Optimization (ZPPO) for TRL."""

__version__ = "0.1.0.dev0"
