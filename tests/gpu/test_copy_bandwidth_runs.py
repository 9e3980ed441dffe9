"""benchmarks/copy_bandwidth.py on a GPU: every way of streaming stages into shared memory copies the whole buffer
(its checksum check raises otherwise) and is timed."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "copy_bandwidth.py"
spec = importlib.util.spec_from_file_location("copy_bandwidth", SCRIPT)
copy_bandwidth = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copy_bandwidth)


def test_every_copy_streams_the_whole_buffer(tmp_path):
    out = tmp_path / "copy.json"
    rows = copy_bandwidth.main(["--mb", "16", "--repeats", "2", "--json", str(out)])
    assert [row["copy"] for row in rows] == [name for name, _, _, _ in copy_bandwidth.configs()]
    assert all(row["tb_s"] > 0 for row in rows) and len({row["bytes"] for row in rows}) == 1  # one buffer for all
    assert json.loads(out.read_text())["rows"] == rows
