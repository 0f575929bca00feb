"""`zppo_trl.batches`: merging TRL's scored rounds and selecting rows keeps every row intact."""

import pytest
import torch

from zppo_trl.batches import concat_batches, select_rows

PAD = 0


def _round(prompts, completions, images=None, offset=0.0):
    """A TRL-style scored batch: prompts left-padded, completions right-padded."""
    p_width = max(len(p) for p in prompts)
    c_width = max(len(c) for c in completions)
    batch = {
        "prompt_ids": torch.tensor([[PAD] * (p_width - len(p)) + p for p in prompts]),
        "prompt_mask": torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts]),
        "completion_ids": torch.tensor([c + [PAD] * (c_width - len(c)) for c in completions]),
        "completion_mask": torch.tensor([[1] * len(c) + [0] * (c_width - len(c)) for c in completions]),
        "old_per_token_logps": torch.tensor(
            [[offset - j for j in range(len(c))] + [0.0] * (c_width - len(c)) for c in completions]
        ),
        "advantages": torch.arange(len(prompts), dtype=torch.float32) + offset,
        "num_items_in_batch": torch.tensor(99),
    }
    # mm_token_type_ids spans prompt and completion: mark prompt token 7 as an image token
    batch["mm_token_type_ids"] = torch.cat(
        [(batch["prompt_ids"] == 7).long(), torch.zeros_like(batch["completion_ids"])], 1
    )
    if images is not None:  # images: number of images per row; each image gets a 1x2x2 grid of 4 patches
        grids = [torch.tensor([[1, 2, 2]]) for n in images for _ in range(n)]
        batch["image_grid_thw"] = torch.cat(grids) if grids else torch.zeros(0, 3, dtype=torch.long)
        batch["pixel_values"] = torch.arange(4 * sum(images) * 3, dtype=torch.float32).reshape(-1, 3) + offset
        batch["num_images"] = list(images)
    return batch


def _unpadded(batch, row):
    p = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
    m = batch["completion_mask"][row].bool()
    return p, batch["completion_ids"][row][m].tolist(), batch["old_per_token_logps"][row][m].tolist()


def test_concat_pads_each_field_on_its_side_and_keeps_rows():
    a = _round([[1, 2], [7, 3, 4]], [[5], [6, 6, 6, 6]])
    b = _round([[7, 8, 9, 10, 11]], [[12, 13]], offset=100.0)
    merged = concat_batches([a, b], PAD)
    assert merged["prompt_ids"].shape == (3, 5) and merged["completion_ids"].shape == (3, 4)
    assert "num_items_in_batch" not in merged
    expected = [_unpadded(a, 0), _unpadded(a, 1), _unpadded(b, 0)]
    assert [_unpadded(merged, i) for i in range(3)] == expected
    assert merged["advantages"].tolist() == [0.0, 1.0, 100.0]
    # the image-token marks still sit on the same tokens after re-padding both halves
    ids = torch.cat([merged["prompt_ids"], merged["completion_ids"]], 1)
    assert torch.equal(merged["mm_token_type_ids"].bool(), ids == 7)


def test_select_rows_repeats_and_reorders_with_images():
    a = _round([[1], [2], [3]], [[4], [5], [6]], images=[1, 0, 2])
    b = _round([[9]], [[8, 8]])  # a round without images
    merged = concat_batches([a, b], PAD)
    picked = select_rows(merged, [2, 3, 0, 0])
    assert picked["prompt_ids"][:, -1].tolist() == [3, 9, 1, 1]
    assert picked["num_images"] == [2, 0, 1, 1]
    # row 2 of `a` owns images 1-2 (patches 4..11), row 0 owns image 0 (patches 0..3)
    per_patch = a["pixel_values"]
    expected = torch.cat([per_patch[4:12], per_patch[0:4], per_patch[0:4]])
    assert torch.equal(picked["pixel_values"], expected)
    assert picked["image_grid_thw"].shape == (4, 3)
    text_only = select_rows(merged, [1, 3])
    assert "pixel_values" not in text_only and "num_images" not in text_only


def test_unknown_fields_are_refused_by_name():
    a = _round([[1]], [[2]])
    a["spatial_shapes"] = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="spatial_shapes"):
        concat_batches([a], PAD)


def test_select_rows_drops_padding_no_selected_row_uses():
    short = _round([[1, 2], [7, 3]], [[5], [6, 6]])
    long = _round([[7, 8, 9, 10, 11, 12]], [[12, 13, 14, 15]], offset=100.0)
    merged = concat_batches([short, long], PAD)
    assert merged["prompt_ids"].shape == (3, 6) and merged["completion_ids"].shape == (3, 4)
    picked = select_rows(merged, [1, 0, 1])
    # only the short round's widths remain, every real token kept, in place
    assert picked["prompt_ids"].shape == (3, 2) and picked["completion_ids"].shape == (3, 2)
    assert picked["old_per_token_logps"].shape == (3, 2) and picked["mm_token_type_ids"].shape == (3, 4)
    assert [_unpadded(picked, i) for i in range(3)] == [_unpadded(short, 1), _unpadded(short, 0), _unpadded(short, 1)]
    ids = torch.cat([picked["prompt_ids"], picked["completion_ids"]], 1)
    assert torch.equal(picked["mm_token_type_ids"].bool(), ids == 7)
    # with the long row selected nothing can go; without trimming nothing does
    assert select_rows(merged, [0, 2])["prompt_ids"].shape == (2, 6)
    assert select_rows(merged, [0], trim=False)["prompt_ids"].shape == (1, 6)
