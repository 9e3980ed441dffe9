"""The demo's model (examples/train_tiny_moe.py) learns before it is served: a random model, what the demo used
to serve, answers in broken UTF-8; a short training takes its loss on held-out text far down and its greedy
answers to whole characters. The held-out text shares no docstring with the training text."""

import importlib.util

import pytest
import torch
from helpers import REPO

from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.tools.text_data import load_documents, token_windows

PROMPTS = ["Return a new", "This module provides", "The quick brown fox"]


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("train_tiny_moe", REPO / "examples" / "train_tiny_moe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def heldout_loss_and_answers(model_dir, heldout) -> tuple[float, list[str]]:
    """Mean next-token loss on 16 windows of the held-out text, and the greedy answers to PROMPTS."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    windows = torch.tensor(token_windows(tokenizer, load_documents(heldout), 129)[:16])
    answers = []
    with torch.no_grad():
        loss = model(input_ids=windows, labels=windows).loss.item()
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=16, do_sample=False)
            answers.append(tokenizer.decode(out[0, ids.shape[1] :]))
    return loss, answers


def test_held_out_text_is_not_training_text(demo, tmp_path):
    demo.write_text(tmp_path)
    heldout = "".join(f"\n\n{doc.strip()}\n\n" for doc in load_documents(tmp_path / "heldout"))
    assert len(heldout) > 30_000
    assert not {p.name for p in (tmp_path / "train").iterdir()} & {p.name for p in (tmp_path / "heldout").iterdir()}
    training = {d for name in demo.MODULES for d in demo.docstrings(name)}
    assert not [d for d in training if f"\n\n{d}\n\n" in heldout]


def test_training_makes_the_model_answer_in_text(demo, tiny_models, tmp_path):
    demo.write_text(tmp_path / "text")
    random = tiny_models["qwen3_moe"]
    random_loss, random_answers = heldout_loss_and_answers(random, tmp_path / "text" / "heldout")
    assert any("\ufffd" in a for a in random_answers)  # partial UTF-8 sequences: what the demo printed
    demo.train(random, tmp_path / "trained", tmp_path / "text" / "train", seconds=600, seed=0, steps=60)
    loss, answers = heldout_loss_and_answers(tmp_path / "trained", tmp_path / "text" / "heldout")
    assert loss < random_loss - 2, (loss, random_loss)
    assert not any("\ufffd" in a for a in answers), answers


def test_training_refuses_an_existing_output_before_it_trains(demo, tiny_models, tmp_path):
    out = tmp_path / "trained"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SamoyedsError, match="already exists; .*--force"):
        demo.train(tiny_models["qwen3_moe"], out, tmp_path / "no-text", seconds=600, seed=0)  # no text read yet
    with pytest.raises(SamoyedsError, match="holds no config.json"):  # --force replaces a model folder only
        demo.train(tiny_models["qwen3_moe"], out, tmp_path / "no-text", seconds=600, seed=0, force=True)
    assert (out / "notes.txt").read_text() == "mine"
