"""The fair floor of a cold fp32 run (benchmarks/cold.py --torchvision, goal 4): the same work written by hand as one
script, every proof kept. Run as a script, it is what a user's script pays: the interpreter, the imports, the work.

    python benchmarks/by_hand.py PROJECT      # prints the seconds of the work alone, imports excluded
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxslim

from trtflow.backends.base import BuildRequest, get_backend
from trtflow.recipe import load_project
from trtflow.run.dag import dag_from_project


def by_hand(root: Path) -> float:
    """The same work written by hand in one process, every proof kept: per recipe, onnxslim on the source model,
    ONNX Runtime running both on the profile's opt and min shapes (what the cleanup proof runs), then each engine
    built from the slimmed model. Seconds, imports excluded."""
    backend, nodes = get_backend("tensorrt-rtx"), dag_from_project(load_project(root))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for recipe in sorted({node.recipe for node in nodes if node.kind == "build"}):
            builds = [node for node in nodes if node.kind == "build" and node.recipe == recipe]
            profile = builds[0].params.profiles[0]
            slimmed = Path(scratch) / f"{recipe}.onnx"
            source = root / "models" / f"{recipe}.onnx"
            onnx.save(onnxslim.slim(onnx.load(source)), slimmed)
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.intra_op_num_threads = 1
            sessions = [ort.InferenceSession(str(path), options) for path in (source, slimmed)]
            rng = np.random.default_rng(0)
            for shape in ("opt", "min"):
                feed = {name: rng.standard_normal(dims[shape]).astype(np.float32) for name, dims in profile.items()}
                want, got = (session.run(None, feed) for session in sessions)
                assert all(np.allclose(g, w, rtol=1e-3, atol=1e-4) for g, w in zip(got, want, strict=True)), recipe
            for node in builds:
                shapes = [{name: (s["min"], s["opt"], s["max"]) for name, s in p.items()} for p in node.params.profiles]
                backend.engine_from_onnx(
                    BuildRequest(
                        onnx_path=slimmed,
                        engine_path=Path(scratch) / "engine",
                        compute_capabilities=list(node.params.compute_capabilities),
                        profiles=shapes,
                        options=node.params.builder_options(),
                    )
                )
    return time.perf_counter() - started


if __name__ == "__main__":
    print(f"{by_hand(Path(sys.argv[1])):.3f}")
