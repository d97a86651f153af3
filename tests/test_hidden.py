"""Hidden states: the aux ids mean layer inputs, the last state is pre-norm, padding changes nothing."""

import torch

from draftline import hidden
from draftline.target import load_target


def test_capture_layout_and_last_state_reproduces_logits(random_target):
    model, _ = load_target(random_target)
    seqs = [[5, 9, 30, 41, 7, 2, 88], [12, 13, 14]]
    states = hidden.capture(model, seqs, random_target["aux_layer_ids"])
    for seq, hs in zip(seqs, states):
        assert hs.shape == (len(seq), 4, random_target["hidden_size"])
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([seq]), output_hidden_states=True)
        for slot, layer_id in enumerate(random_target["aux_layer_ids"]):
            torch.testing.assert_close(hs[:, slot], ref.hidden_states[layer_id][0], rtol=1e-4, atol=1e-5)
        # through the target's final norm and lm_head, the stored last state gives the target's logits
        logits = model.lm_head(model.model.norm(hs[:, 3]))
        torch.testing.assert_close(logits, ref.logits[0], rtol=1e-4, atol=1e-4)
        # and it is not the post-norm state HF returns last
        assert not torch.allclose(hs[:, 3], ref.hidden_states[-1][0], atol=1e-3)


def test_files_resume_and_corruption(tmp_path, random_target):
    model, _ = load_target(random_target)
    ids = [3, 4, 5, 6]
    hs = hidden.capture(model, [ids], random_target["aux_layer_ids"])[0]
    path = hidden.hs_path(tmp_path, 0)
    hidden.save_hidden_states(path, ids, hs, torch.bfloat16)
    H = random_target["hidden_size"]
    assert hidden.is_valid_file(path, ids, H)
    assert not hidden.is_valid_file(path, ids + [7], H)  # other tokens: redo
    path.write_bytes(path.read_bytes()[:-50])  # truncated by a kill
    assert not hidden.is_valid_file(path, ids, H)
    assert not hidden.is_valid_file(hidden.hs_path(tmp_path, 1), ids, H)


def test_token_budget_batches():
    lengths = {0: 10, 1: 300, 2: 12, 3: 290, 4: 11}
    batches = hidden.token_budget_batches(lengths, 600)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 600 or len(b) == 1


def test_disk_guard(tmp_path):
    import pytest

    with pytest.raises(RuntimeError, match="not enough disk"):
        hidden.check_disk(tmp_path, 10**18, 1.1)
    hidden.check_disk(tmp_path, 1, 1.1)
