"""The windows `eval` scores: every token of a document exactly once, each with as much context as promised."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.tools.evaluate import engine_command, windows
from samoyeds_vllm.tools.vllm_server import CPU_MEMORY_UTILIZATION


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(2, 64), st.data())
def test_every_token_scored_once_with_context(length, window, data):
    stride = data.draw(st.integers(1, window))
    ids = list(range(100, 100 + length))
    sep = 7
    seq = [sep, *ids]
    scored = []
    for w in windows(ids, sep, window, stride):
        assert 1 <= w.scored <= len(w.tokens) - 1 + (w.tokens[0] != sep) and len(w.tokens) <= window
        start = seq.index(w.tokens[0]) if w.tokens[0] != sep else 0
        assert seq[start : start + len(w.tokens)] == w.tokens
        first = start + len(w.tokens) - w.scored
        scored += range(first, start + len(w.tokens))
        # A token past the first window sees at least window - stride tokens before it.
        if start > 0:
            assert first - start >= window - stride
    assert scored == list(range(1, length + 1))  # the separator is context, never scored


def test_bad_window_or_stride():
    for window, stride in [(1, 1), (8, 0), (8, 9)]:
        with pytest.raises(SamoyedsError, match="window"):
            windows([1, 2, 3], 0, window, stride)


def test_a_cpu_engine_takes_a_share_of_ram_that_the_user_can_override(monkeypatch):
    """vLLM's CPU default (0.92 of the node's RAM) refuses to start on a busy machine; eval asks for less, and an
    --engine-args flag still wins (vLLM's parser keeps a repeated flag's last value)."""
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parser.parse_args(engine_command("m", 1025, [])).gpu_memory_utilization == CPU_MEMORY_UTILIZATION
    flags = ["--gpu-memory-utilization", "0.5"]
    assert parser.parse_args(engine_command("m", 1025, flags)).gpu_memory_utilization == 0.5
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "--gpu-memory-utilization" not in engine_command("m", 1025, [])


def test_eval_refuses_bad_numbers_and_outputs_before_any_work(tiny_models, tmp_path, capsys, monkeypatch):
    """From a user walk: --window 0 / --max-tokens -3 ran with the defaults, an unwritable --json failed after the
    whole evaluation with a traceback, `--engine-args "--enforce-eager"` was refused by argparse and an unbalanced
    quote ended in a traceback. Each is now refused at once, in one line."""
    from samoyeds_vllm import cli
    from samoyeds_vllm.tools import evaluate as evaluate_module

    def no_engine(*args, **kwargs):
        raise AssertionError("no engine may start")

    monkeypatch.setattr(evaluate_module, "_engine", no_engine)
    model, data = str(tiny_models["qwen3_moe"]), str(tmp_path / "text.txt")
    (tmp_path / "text.txt").write_text("some text to score")
    for flags, message in [
        (["--window", "0"], "--window wants a positive number of tokens, not 0"),
        (["--stride", "0"], "--stride wants a positive number of tokens, not 0"),
        (["--max-tokens", "-3"], "--max-tokens wants a positive number of tokens, not -3"),
        (["--json", data + "/out.json"], "text.txt is a file, not a folder"),
        (["--json", str(tmp_path)], "a folder, not a file"),
        (["--engine-args", '"unbalanced'], "--engine-args '\"unbalanced': No closing quotation"),
    ]:
        assert cli.main(["eval", model, "--data", data, *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags
    # a flag alone, without =, reaches the engine
    seen = {}

    def stop(*args, **kwargs):
        seen.update(kwargs)
        raise SamoyedsError("stop")

    monkeypatch.setattr(evaluate_module, "evaluate", stop)
    assert cli.main(["eval", model, "--data", data, "--engine-args", "--enforce-eager"]) == 2
    assert seen["engine_flags"] == ["--enforce-eager"]


def test_eval_refuses_a_damaged_checkpoint_by_name_before_the_engine(tiny_models, tmp_path, capsys, monkeypatch):
    """From a fourth walk: a weights file cut short failed 45 s later in the engine's log ("incomplete metadata",
    no file named), or inside a pydantic traceback for a sparse model; eval now says it in convert's words."""
    import shutil

    from samoyeds_vllm import cli
    from samoyeds_vllm.tools import evaluate as evaluate_module

    def no_engine(*args, **kwargs):
        raise AssertionError("no engine may start")

    monkeypatch.setattr(evaluate_module, "_engine", no_engine)
    model = shutil.copytree(tiny_models["qwen3_moe"], tmp_path / "model")
    (shard,) = model.glob("*.safetensors")
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    (tmp_path / "text.txt").write_text("some text to score")
    assert cli.main(["eval", str(model), "--data", str(tmp_path / "text.txt")]) == 2
    assert f"{shard.name}: corrupted or truncated safetensors file" in capsys.readouterr().err


def test_max_tokens_cuts_the_last_document(tiny_models, tmp_path, monkeypatch):
    """From a walk: a plain-text file is one document, and --max-tokens 4096 scored all 166,733 of its tokens."""
    from samoyeds_vllm.tools import evaluate as evaluate_module

    monkeypatch.setattr(evaluate_module, "_engine", lambda *args: None)
    monkeypatch.setattr(
        evaluate_module, "_engine_logprobs", lambda llm, requests: [[-1.0] * w.scored for w in requests]
    )
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    model = tiny_models["qwen3_moe"]
    whole = evaluate_module.evaluate(model, str(text), window=64)
    assert whole.tokens > 300
    cut = evaluate_module.evaluate(model, str(text), window=64, max_tokens=300)
    assert (cut.documents, cut.tokens, cut.nll) == (1, 300, 300.0)
    assert 0 < cut.bytes < whole.bytes * 300 / whole.tokens * 1.2  # the bytes of the scored start, not the file's
