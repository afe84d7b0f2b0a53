"""`--executor ray` on real Ray: a local instance and a cluster of a head and two labelled worker nodes, all inside a
network namespace of the test's own with only loopback up (no traffic leaves the machine), started and stopped here.

One script inside the namespace runs every Ray scenario in turn (a cluster takes ~15 s to start on 2 cores); the tests
then check its results: packages byte-identical to a local run, builds on the nodes their target's labels name,
an unsatisfiable label failing fast with exit 4, a worker node killed mid-run, an unreachable address.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import PIPELINE, trtflow, write_project

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'trtflow[ray]'")

LABELLED = PIPELINE.replace(
    "compute_capabilities: [sm_86]", "compute_capabilities: [sm_86]\n    runs_on: {gpu-class: ampere}"
).replace("compute_capabilities: [sm_89]", "compute_capabilities: [sm_89]\n    runs_on: {gpu-class: ada}")
UNSATISFIABLE = PIPELINE.replace(
    "compute_capabilities: [sm_89]", "compute_capabilities: [sm_89]\n    runs_on: {gpu-class: l4}"
)

SCENARIOS = r"""
set -u
ip link set lo up
export RAY_USAGE_STATS_ENABLED=0 RAY_health_check_period_ms=500
export RAY_health_check_failure_threshold=4 RAY_health_check_timeout_ms=1000
cd "$ROOT"
trtflow() { "$PYTHON" -m trtflow "$@"; }
timed() {
  local name=$1; shift; local t0=$(date +%s%N)
  "$@" > "$name.json" 2> "$name.err"; echo $? > "$name.exit"
  echo $(( ($(date +%s%N) - t0) / 1000000 )) > "$name.ms"
}
worker() {
  setsid ray start --address "$ADDR" --num-cpus 1 --node-ip-address 127.0.0.1 "$@" --block > "worker-$RANDOM.log" 2>&1 &
  echo $!
}
alive_nodes() { "$PYTHON" -c "
import ray, sys, time
ray.init(address='$ADDR', log_to_driver=False, logging_level='ERROR')
deadline = time.time() + 120
while sum(1 for n in ray.nodes() if n['Alive']) != $1 and time.time() < deadline:
    time.sleep(0.2)
"; }

# 1. a local Ray instance (no address). Its own HOME: Ray (2.52+) saves a token for a local instance in
#    ~/.ray/auth_token, and a driver holding one cannot join the cluster below, started without token auth
HOME="$ROOT/home-local" timed local-instance trtflow -C local-instance run --executor ray -j 2 --json
export HOME="$ROOT/home-cluster"

# 2. a head with no CPUs and two labelled worker nodes
ray start --head --port 0 --num-cpus 0 --node-ip-address 127.0.0.1 --include-dashboard=false --disable-usage-stats \
  > head.log 2>&1
ADDR=$(grep -o "ray start --address='[^']*'" head.log | head -1 | sed "s/.*='\(.*\)'/\1/")
# one at a time: two raylets starting at once time out on 2 cores
AMPERE=$(worker --labels gpu-class=ampere); alive_nodes 2
ADA=$(worker --labels gpu-class=ada); alive_nodes 3
timed labelled trtflow -C labelled run --ray-address "$ADDR" -j 2 --json
timed unsatisfiable trtflow -C unsatisfiable run --ray-address "$ADDR" --json

# 3. node loss: only the ada node is left; it is killed (its process group) once a stage runs on it, and a
#    new node joins; the stage must be retried there
kill -9 -- -$AMPERE; alive_nodes 2
rm -rf /tmp/trtflow-ray-*
( timed node-loss trtflow -C node-loss run --ray-address "$ADDR" -j 1 --json ) &
RUN=$!
SEEN=no
for i in $(seq 1 1200); do
  SCRATCH=$(ls -d /tmp/trtflow-ray-* 2> /dev/null | head -1); [ -n "$SCRATCH" ] && SEEN=yes && break; sleep 0.05
done
# the task's worker process (its pid is in the scratch folder's name) and its raylet die first
if [ "$SEEN" = yes ]; then
  WORKER=$(basename "$SCRATCH" | cut -d- -f3)
  kill -9 "$WORKER" $(ps -o ppid= -p "$WORKER") 2> /dev/null
fi
kill -9 -- -$ADA
echo "$SEEN" > node-loss.killed  # yes: a stage was running on the node when it was killed
SPARE=$(worker)
wait $RUN
ray stop --force > /dev/null 2>&1
rm -rf /tmp/trtflow-ray-*  # the killed node's scratch folder

# 4. an address nothing answers on
timed unreachable trtflow -C labelled run --ray-address 127.0.0.1:1 --force --json
"""


def _namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every Ray scenario run once in a loopback-only network namespace; returns the folder with their results."""
    if not _namespaces_work() or shutil.which("ip") is None:
        pytest.skip("needs `unshare -n` (root) and `ip` to keep Ray on loopback")
    root = tmp_path_factory.mktemp("ray")
    reference = write_project(root / "reference")
    assert trtflow(reference, "run", "-j", "2").code == 0
    write_project(root / "local-instance")
    write_project(root / "labelled", pipeline=LABELLED)
    write_project(root / "unsatisfiable", pipeline=UNSATISFIABLE)
    write_project(root / "node-loss")
    (root / "scenarios.sh").write_text(textwrap.dedent(SCENARIOS))
    env = {
        **os.environ,
        "ROOT": str(root),
        "PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["unshare", "-n", "bash", str(root / "scenarios.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    assert (root / "node-loss.exit").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return root


RAY_NATIVE_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] ")  # Ray's C++ core logging to stderr


def result(root: Path, name: str) -> tuple[int, dict, str]:
    """(exit code, --json summary or {}, stderr without Ray's own native log lines) of one scenario's run."""
    code = int((root / f"{name}.exit").read_text())
    text = (root / f"{name}.json").read_text()
    err = "".join(
        line for line in (root / f"{name}.err").read_text().splitlines(keepends=True) if not RAY_NATIVE_LOG.match(line)
    )
    return code, json.loads(text) if text.strip() else {}, err


def package_bytes(project: Path) -> dict[str, bytes]:
    packages = project / "artifacts" / "packages"
    return {p.relative_to(packages).as_posix(): p.read_bytes() for p in sorted(packages.rglob("*")) if p.is_file()}


def test_a_local_ray_instance_makes_the_packages_a_local_run_makes(scenarios: Path) -> None:
    code, summary, err = result(scenarios, "local-instance")
    assert code == 0, err
    assert summary["built"] == 7 and all(node["node"]["id"] for node in summary["nodes"])
    assert package_bytes(scenarios / "local-instance") == package_bytes(scenarios / "reference")


def test_each_build_runs_on_a_node_with_its_targets_labels(scenarios: Path) -> None:
    code, summary, err = result(scenarios, "labelled")
    assert code == 0, err
    builds = {
        node["id"]: node["node"]["labels"].get("gpu-class") for node in summary["nodes"] if node["kind"] == "build"
    }
    assert builds == {"build:tiny/fp32/rtx-ampere": "ampere", "build:tiny/fp32/rtx-ada": "ada"}
    # runs_on is placement, not content
    assert package_bytes(scenarios / "labelled") == package_bytes(scenarios / "reference")


def test_labels_no_node_has_fail_fast_naming_them(scenarios: Path) -> None:
    code, _, err = result(scenarios, "unsatisfiable")
    assert code == 4
    # what is asked and what there is
    assert "gpu-class=l4" in err and "target rtx-ada" in err and "gpu-class=ada" in err
    assert len(err.strip().splitlines()) == 1
    assert int((scenarios / "unsatisfiable.ms").read_text()) < 60_000


def test_a_node_lost_mid_run_costs_a_retry_not_the_run(scenarios: Path) -> None:
    code, summary, err = result(scenarios, "node-loss")
    assert (scenarios / "node-loss.killed").read_text().strip() == "yes" and code == 0, err
    assert summary["built"] == 7 and summary["failed"] == 0
    first = next(node for node in summary["nodes"] if node["id"] == "cleanup:tiny")
    assert "gpu-class" not in first["node"]["labels"]  # killed on the ada node, re-run by Ray on the node that joined
    assert package_bytes(scenarios / "node-loss") == package_bytes(scenarios / "reference")


def test_an_unreachable_address_is_one_line_and_exit_4(scenarios: Path) -> None:
    code, _, err = result(scenarios, "unreachable")
    assert code == 4 and "cannot reach the Ray cluster at 127.0.0.1:1" in err
    assert len(err.strip().splitlines()) == 1
