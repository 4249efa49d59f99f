"""Run by the MosaicML streaming environment (.venv-mds: mosaicml-streaming needs numpy < 2.2 and
torchvision, which this project's environment cannot hold): read a raypack mds dataset with
streaming's own LocalDataset and StreamingDataset, write each shard again with its MDSWriter, and
save what it saw for tests/formats/test_formats.py to compare with raypack's packs.

    python mds_client.py DATASET_DIR OUT.npz
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from streaming import LocalDataset, MDSWriter, StreamingDataset

COLUMNS = {"doc_offsets": "ndarray:int32", "num_tokens": "int32", "tokens": "ndarray:int32"}


def main(dataset: Path, out: Path) -> None:
    saved: dict[str, np.ndarray] = {}
    same_bytes = []
    for index in sorted(dataset.rglob("index.json")):
        root = index.parent
        name = str(root.relative_to(dataset))
        local = LocalDataset(local=str(root))
        samples = [local[i] for i in range(len(local))]
        streamed = list(StreamingDataset(local=str(root), shuffle=False, batch_size=1))
        if len(streamed) != len(samples) or any(
            not np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(samples, streamed, strict=True)
        ):
            raise SystemExit(f"{name}: StreamingDataset and LocalDataset disagree")
        saved[f"{name}/tokens"] = np.stack([s["tokens"] for s in samples])
        saved[f"{name}/num_tokens"] = np.array([int(s["num_tokens"]) for s in samples])
        offsets = [s["doc_offsets"] for s in samples]
        saved[f"{name}/doc_offsets"] = np.concatenate(offsets)
        saved[f"{name}/doc_counts"] = np.array([len(o) for o in offsets])
        # Each shard written again by streaming's own writer, from what its reader returned.
        first = 0
        for shard in json.loads(index.read_text())["shards"]:
            n = shard["samples"]
            with tempfile.TemporaryDirectory() as tmp:
                with MDSWriter(columns=COLUMNS, out=tmp, size_limit=None) as writer:
                    for s in samples[first : first + n]:
                        writer.write(
                            {
                                "doc_offsets": s["doc_offsets"],
                                "num_tokens": int(s["num_tokens"]),
                                "tokens": s["tokens"],
                            }
                        )
                theirs = (Path(tmp) / "shard.00000.mds").read_bytes()
            ours = (root / shard["raw_data"]["basename"]).read_bytes()
            same_bytes.append(theirs == ours)
            first += n
    saved["same_bytes"] = np.array(same_bytes)
    np.savez(out, **saved)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
