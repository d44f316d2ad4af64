"""CLIPTextModelWithProjection against transformers: tiny random CLIP text
encoders (quick_gelu as CLIP-L, gelu as CLIP-G; the old eos_token_id 2 and
the real end-of-text id) saved with save_pretrained, every parameter of
rank <= 1 perturbed; the hidden states SD3 reads (-2), the last and the
embeddings, and text_embeds, in f32 within 1e-4; fp16 weights; errors."""
import pytest
import torch
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

import hubrt
from diffusion_util import perturb, rel_err
from oracle import to_hr, to_torch


def make_clip(path, act="quick_gelu", eos=2, with_projection=True, seed=0):
    torch.manual_seed(seed)
    cfg = CLIPTextConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, max_position_embeddings=20, projection_dim=24, hidden_act=act,
                         eos_token_id=eos, bos_token_id=97 if eos != 2 else 0, pad_token_id=1)
    model = (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg).eval()
    perturb(model, seed)
    model.save_pretrained(path)
    return model


def ids_with_eos(eos):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 90, (2, 20), generator=g)
    ids[0, 7] = eos if eos != 2 else 98  # the end of each prompt: the largest id when eos_token_id is 2
    ids[1, 12] = eos if eos != 2 else 98
    ids[0, 8:] = eos if eos != 2 else 98  # padded with the end token, as CLIP-L's tokenizer pads
    return ids


@pytest.mark.parametrize("act,eos", [("quick_gelu", 2), ("gelu", 98)])
def test_clip_text_matches_transformers(tmp_path, act, eos):
    ref = make_clip(tmp_path / "te", act, eos)
    ids = ids_with_eos(eos)
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
    model = hubrt.CLIPTextModelWithProjection.from_pretrained(tmp_path / "te", dtype="float32")
    for index in (-2, -1, 0, 1):
        got = model(to_hr(ids), hidden_index=index)
        assert rel_err(got.hidden_state, out.hidden_states[index]) <= 1e-4, index
    assert rel_err(got.text_embeds, out.text_embeds) <= 1e-4


def test_fp16_weights_and_a_model_without_projection(tmp_path):
    ref = make_clip(tmp_path / "te", "gelu", 98, with_projection=False)
    ids = ids_with_eos(98)
    with torch.no_grad():
        want = ref(ids, output_hidden_states=True).hidden_states[-2]
    model = hubrt.CLIPTextModelWithProjection.from_pretrained(tmp_path / "te")
    assert rel_err(model(to_hr(ids), hidden_index=-2, text_embeds=False).hidden_state, want) <= 1e-4
    with pytest.raises(hubrt.HubrtError, match="has no text_projection"):
        model(to_hr(ids))
    ref.half().save_pretrained(tmp_path / "te16")
    with torch.no_grad():
        want16 = ref.float()(ids, output_hidden_states=True).hidden_states[-2]
    model16 = hubrt.CLIPTextModelWithProjection.from_pretrained(tmp_path / "te16", dtype="float32")
    assert rel_err(model16(to_hr(ids), hidden_index=-2, text_embeds=False).hidden_state, want16) <= 1e-4


def test_clip_errors_name_the_problem(tmp_path):
    make_clip(tmp_path / "te")
    model = hubrt.CLIPTextModelWithProjection.from_pretrained(tmp_path / "te")
    with pytest.raises(hubrt.HubrtError, match=r"input_ids \[1, 21\] i64 must be integer \[b, l\] with l <= 20"):
        model(to_hr(torch.zeros(1, 21, dtype=torch.int64)))
    with pytest.raises(hubrt.HubrtError, match="hidden state 4 of 4"):
        model(to_hr(torch.zeros(1, 5, dtype=torch.int64)), hidden_index=4)


def test_xla_cpu_equals_cpu(tmp_path):
    import numpy as np
    try:
        hubrt.from_numpy(np.zeros(1, np.float32)).to("xla_cpu")
    except hubrt.HubrtError as e:
        pytest.skip(f"xla_cpu PJRT plugin unavailable: {e}")
    make_clip(tmp_path / "te", "gelu", 98)
    ids = ids_with_eos(98)
    cpu = hubrt.CLIPTextModelWithProjection.from_pretrained(tmp_path / "te")(to_hr(ids), hidden_index=-2)
    xla = hubrt.CLIPTextModelWithProjection.from_pretrained(tmp_path / "te", device="xla_cpu")(
        to_hr(ids).to("xla_cpu"), hidden_index=-2)
    assert xla.hidden_state.device == "xla_cpu:0"
    assert rel_err(xla.hidden_state.to("cpu"), to_torch(cpu.hidden_state)) <= 1e-5
    assert rel_err(xla.text_embeds.to("cpu"), to_torch(cpu.text_embeds)) <= 1e-5
