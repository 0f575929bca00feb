"""The student backbone families outside Qwen3.5 that the paper trains (its appendix on two other students).

The paper runs the Qwen3.5-2B recipe unchanged on InternVL3.5-2B and Ovis2.5-2B, with the same
teacher, and names each block by its backbone. This module says which family a student belongs
to, as the paper's table prints it, so a run's ``variant`` names it (``ZPPO (InternVL3.5-2B)``),
and which families this project cannot train (and why), so a recipe fails with the reason rather
than training a vision-language student as a text model.

Qwen students get no family name, so the names of the Qwen rows do not change.
"""

from __future__ import annotations

__all__ = ["PAPER_BACKBONES", "UNSUPPORTED", "backbone_family", "known_model_type", "unsupported_reason"]

# The two students of the appendix, by their Hub ids: (the paper's name, the config's model_type).
PAPER_BACKBONES = {
    "OpenGVLab/InternVL3_5-2B-HF": ("InternVL3.5-2B", "internvl"),  # transformers-format weights
    "AIDC-AI/Ovis2.5-2B": ("Ovis2.5-2B", "ovis2_5"),  # remote code only: see UNSUPPORTED
}
# Any other checkpoint of these model types (a local copy, a checkpoint of a run): the family alone.
_FAMILY_NAMES = {"internvl": "InternVL", "ovis2": "Ovis2", "ovis2_5": "Ovis2.5"}

# Families that cannot train here, with the reason (the paper's Ovis2.5 among them).
UNSUPPORTED = {
    "ovis2_5": (
        "Ovis2.5 has no transformers code in transformers 5.23, only the Hub's remote code "
        "(huggingface/transformers#47659, open, adds it); ZPPOTrainer's image path needs a transformers "
        "processor and model class (TRL's GRPOTrainer calls the processor and passes its outputs to the model). "
        "transformers' Ovis2 (model_type 'ovis2') trains"
    ),
}


def backbone_family(name_or_path: str | None, model_type: str | None = None) -> str | None:
    """The paper's name of a non-Qwen student's backbone (``InternVL3.5-2B``), or None for any other student.

    ``name_or_path`` alone names the paper's two students (a dry run reads no config); ``model_type``
    (the student's config) names any other checkpoint of those families by the family alone.
    """
    if name_or_path in PAPER_BACKBONES:
        return PAPER_BACKBONES[name_or_path][0]
    return _FAMILY_NAMES.get(model_type or "")


def known_model_type(name_or_path: str | None) -> str | None:
    """The config's ``model_type`` of one of the paper's two students, known without reading its config."""
    return PAPER_BACKBONES[name_or_path][1] if name_or_path in PAPER_BACKBONES else None


def unsupported_reason(model_type: str | None) -> str | None:
    """Why a student of ``model_type`` cannot be trained here, or None when it can."""
    return UNSUPPORTED.get(model_type or "")
