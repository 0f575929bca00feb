"""zppo_trl: Zone of Proximal Policy Optimization (ZPPO) for TRL.

The pure modules (`prompts`, `rewards`, `replay`, `advantages`, `reformulate`, `objectives`) import no
TRL; `ZPPOConfig` (and the trainer) are imported lazily so `import zppo_trl` stays light.
"""

__version__ = "0.1.0.dev0"

__all__ = ["ZPPOConfig", "ZPPOTrainer"]


def __getattr__(name: str):
    if name == "ZPPOConfig":
        from .config import ZPPOConfig

        return ZPPOConfig
    if name == "ZPPOTrainer":
        from .trainer import ZPPOTrainer

        return ZPPOTrainer
    raise AttributeError(f"module 'zppo_trl' has no attribute {name!r}")
