"""The device layer's shared JSON caches: concurrent merges (ranks of one job) lose no entry, and a
reader never sees half a file."""

from __future__ import annotations

import json
import threading

from portachat.device.json_cache import merge_json_entry, read_json


def test_concurrent_merges_keep_every_entry(tmp_path):
    path = tmp_path / "home" / "calibration.json"

    def rank(r: int) -> None:
        for i in range(15):
            merge_json_entry(path, f"rank{r}|{i}", {"flops": r * 100 + i})

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = json.loads(path.read_text())
    assert len(data) == 60 and data["rank3|14"] == {"flops": 314}
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".tmp-")]  # no temporaries left


def test_unreadable_or_foreign_files_read_as_empty(tmp_path):
    assert read_json(tmp_path / "missing.json") == {}
    (tmp_path / "half.json").write_text('{"a": 1')
    assert read_json(tmp_path / "half.json") == {}
    (tmp_path / "list.json").write_text("[1, 2]")
    assert read_json(tmp_path / "list.json") == {}
    merge_json_entry(tmp_path / "half.json", "b", 2)  # a broken cache is replaced, not fatal
    assert read_json(tmp_path / "half.json") == {"b": 2}
