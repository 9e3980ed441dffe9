"""`recover` on tiny models (CPU): distillation brings the student closer to the teacher, pruned weights stay
zero, an interrupted run resumes to the same result, and a DENSE / SPARSE pair that does not belong together is
refused."""

import json
import shutil

import pytest
import torch
from helpers import read_checkpoint, write_calibration_text

from samoyeds_vllm.errors import CheckpointError, SamoyedsError
from samoyeds_vllm.format import Pattern, satisfies
from samoyeds_vllm.tools import recover as recover_module
from samoyeds_vllm.tools.convert import convert
from samoyeds_vllm.tools.recover import RecoverSettings, recover, unpack_to_dense

PATTERN = Pattern.parse("samoyeds")


@pytest.fixture(scope="module")
def pair(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("recover")
    text = write_calibration_text(root / "text")
    dense = tiny_models["qwen3_moe"]
    convert(dense, root / "sparse", PATTERN, progress=False)
    return dense, root / "sparse", text


def _settings(text, **kw):
    return RecoverSettings(data=str(text), **({"steps": 6, "seq_len": 32, "batch": 4, "lr": 3e-3} | kw))


def _kl_to_teacher(dense, packed, tmp_path, text) -> float:
    """Mean KL(teacher || student) on fixed windows, the student read back from a packed checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from samoyeds_vllm.tools.text_data import calibration_windows, load_documents

    unpacked = tmp_path / f"unpacked-{packed.name}"
    unpack_to_dense(packed, unpacked)
    tokenizer = AutoTokenizer.from_pretrained(dense)
    ids = torch.tensor(calibration_windows(tokenizer, load_documents(text), 8, 32, seed=99))
    with torch.no_grad():
        t = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)(input_ids=ids).logits.log_softmax(-1)
        s = AutoModelForCausalLM.from_pretrained(unpacked, dtype=torch.float32)(input_ids=ids).logits.log_softmax(-1)
    return float((t.exp() * (t - s)).sum(-1).mean())


def test_recover_moves_the_student_towards_the_teacher_and_keeps_the_masks(pair, tmp_path):
    dense, sparse, text = pair
    log = recover(dense, sparse, tmp_path / "out", _settings(text, eval_data=str(text), eval_every=3))
    out = tmp_path / "out"
    assert _kl_to_teacher(dense, out, tmp_path, text) < _kl_to_teacher(dense, sparse, tmp_path, text)
    before, after = read_checkpoint(tmp_path / f"unpacked-{sparse.name}"), read_checkpoint(tmp_path / "unpacked-out")
    experts = [n for n in before if ".experts." in n]
    assert experts
    for name in experts:
        assert satisfies(after[name], PATTERN)
        assert not ((after[name] != 0) & (before[name] == 0)).any(), f"{name}: a pruned weight came back"
    changed = sum(not torch.equal(before[n], after[n]) for n in experts)
    assert changed == len(experts)  # every expert trained
    others = [n for n in before if ".experts." not in n]
    assert all(torch.equal(before[n], after[n]) for n in others)  # the rest stays frozen by default
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["recovery"]["steps"] == 6 and quant["pruning_method"] == "magnitude"
    report = json.loads((out / "samoyeds_report.json").read_text())
    assert report["method"] == "magnitude" and report["recovery"] == quant["recovery"]
    assert [s["step"] for s in log["steps"]] == [1, 2, 3, 4, 5, 6] and len(log["eval"]) == 3
    assert (out / "recover_loss.png").stat().st_size and (out / "recover_perplexity.png").stat().st_size
    assert not list(tmp_path.glob(".out.partial-*")) and not (tmp_path / ".out.recover-state").exists()


def test_interrupted_recovery_resumes_to_the_same_result(pair, tmp_path, monkeypatch):
    dense, sparse, text = pair
    settings = _settings(text, save_every=2)
    recover(dense, sparse, tmp_path / "straight", settings)

    real_loss, calls = recover_module._distillation_loss, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # in step 4: steps 1-2 were saved, step 3 is lost
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(recover_module, "_distillation_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        recover(dense, sparse, tmp_path / "resumed", settings)
    assert not (tmp_path / "resumed").exists() and (tmp_path / ".resumed.recover-state").is_dir()
    monkeypatch.setattr(recover_module, "_distillation_loss", real_loss)
    log = recover(dense, sparse, tmp_path / "resumed", settings)
    assert [s["step"] for s in log["steps"]] == [1, 2, 3, 4, 5, 6]
    straight = recover_module.json.loads((tmp_path / "straight" / "recover_log.json").read_text())
    for s, r in zip(straight["steps"], log["steps"], strict=True):  # the same losses: it went on from step 2
        assert r["kl"] == pytest.approx(s["kl"], rel=1e-4)
    a, b = read_checkpoint(tmp_path / "straight"), read_checkpoint(tmp_path / "resumed")
    start = read_checkpoint(sparse)
    for name in a:  # same masks; values equal up to float rounding, which AdamW amplifies for tiny gradients
        if not a[name].is_floating_point():
            assert torch.equal(a[name], b[name]), name
        elif not torch.equal(a[name], start[name]):
            moved = (a[name].double() - start[name].double()).norm()
            assert (a[name].double() - b[name].double()).norm() < 0.05 * moved, name
    # A leftover run is resumed only for the same inputs and settings: it trained the old student when a rerun
    # named another SPARSE (convert's output of another model) into the same OUT.
    calls.clear()
    monkeypatch.setattr(recover_module, "_distillation_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        recover(dense, sparse, tmp_path / "again", settings)
    monkeypatch.setattr(recover_module, "_distillation_loss", real_loss)
    with pytest.raises(SamoyedsError, match=r"interrupted recovery of other settings \(saved at step 2\)"):
        recover(dense, sparse, tmp_path / "again", _settings(text, save_every=2, lr=1e-3))
    other = shutil.copytree(sparse, tmp_path / "other-sparse")
    with pytest.raises(SamoyedsError, match="interrupted recovery of other inputs"):
        recover(dense, other, tmp_path / "again", settings)
    # A state without progress (a run that failed before its first save) is started again.
    (tmp_path / ".fresh.recover-state").mkdir()
    (tmp_path / ".fresh.recover-state" / "run.json").write_text("{}")
    assert [s["step"] for s in recover(dense, other, tmp_path / "fresh", settings)["steps"]] == [1, 2, 3, 4, 5, 6]


def test_mismatched_pairs_are_refused(pair, tiny_models, tmp_path):
    dense, sparse, text = pair
    with pytest.raises(SamoyedsError, match="--steps must be at least 1, not 0"):
        recover(dense, sparse, tmp_path / "o", _settings(text, steps=0))
    with pytest.raises(CheckpointError, match="not a packed samoyeds checkpoint"):
        recover(dense, dense, tmp_path / "o", _settings(text))
    with pytest.raises(CheckpointError, match="configs differ"):
        recover(tiny_models["mixtral"], sparse, tmp_path / "o", _settings(text))
    with pytest.raises(CheckpointError, match="the teacher must be the dense model"):
        recover(sparse, sparse, tmp_path / "o", _settings(text))
    with pytest.raises(CheckpointError, match=r"recover does not support checkpoints with fused experts \(llama4"):
        recover(tiny_models["llama4_text"], sparse, tmp_path / "o", _settings(text))
    from_fp8 = tmp_path / "from-fp8"  # converted from an FP8 block-quantized checkpoint: FP8 attention
    shutil.copytree(sparse, from_fp8)
    config = json.loads((from_fp8 / "config.json").read_text())
    config["quantization_config"] |= {
        "format_version": 3,
        "other_layers": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    (from_fp8 / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="keeps the FP8 layers of the checkpoint it was converted from"):
        recover(dense, from_fp8, tmp_path / "o", _settings(text))
    assert not (tmp_path / "o").exists()
    for out in (dense, sparse, dense.parent):  # --force over the teacher, the student or a folder holding them
        with pytest.raises(SamoyedsError, match="the input directory"):
            recover(dense, sparse, out, _settings(text), force=True)
    assert (dense / "config.json").is_file() and (sparse / "config.json").is_file()


def test_damaged_inputs_are_refused_by_name(pair, tmp_path):
    """A teacher cut short, or a packed tensor of the wrong shape, was a traceback from transformers or from
    unpacking; both are now refused in convert's words before any training."""
    from safetensors.torch import load_file, save_file

    dense, sparse, text = pair
    cut = shutil.copytree(dense, tmp_path / "dense-cut")
    (shard,) = cut.glob("*.safetensors")
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    with pytest.raises(CheckpointError, match=rf"{shard.name}: corrupted or truncated safetensors file"):
        recover(cut, sparse, tmp_path / "o", _settings(text))
    bad = shutil.copytree(sparse, tmp_path / "sparse-bad")
    (shard,) = bad.glob("*.safetensors")
    tensors = load_file(shard)
    name = next(n for n in tensors if n.endswith("experts.2.down_proj.weight_packed"))
    tensors[name] = tensors[name][:, : tensors[name].shape[1] // 2].contiguous()
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(SamoyedsError, match=r"sparse-bad: .*experts.2.down_proj: packed values has shape"):
        recover(dense, bad, tmp_path / "o", _settings(text))
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.recover-state").exists()


def test_fp8_values_stay_fp8(pair, tmp_path):
    """A student with FP8 values is written back with FP8 values, quantized from its trained weights."""
    from samoyeds_vllm.format import FP8

    dense, _, text = pair
    sparse = tmp_path / "sparse-fp8"
    convert(dense, sparse, PATTERN, values=FP8, progress=False)
    recover(dense, sparse, tmp_path / "out", _settings(text, steps=2))
    quant = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert quant["values"] == "float8_e4m3fn"
    stored = read_checkpoint(tmp_path / "out")
    packed = [t for name, t in stored.items() if name.endswith(".weight_packed")]
    assert packed and all(t.dtype == FP8 for t in packed)
