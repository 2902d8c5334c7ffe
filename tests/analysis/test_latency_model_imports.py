"""scikit-learn is loaded at the latency model's first fit, not at the agent's start, and with one BLAS thread.

The agent imports the latency model at start (the page's change report needs its load model), before it compiles
its BPF programs. With scikit-learn imported then, its ~90 MiB and the compiler's stacked to a 257 MiB peak
(docs/BENCHMARKS.md, "Memory"). Each check runs in a fresh interpreter: this test process has imported everything.
"""

import json
import subprocess
import sys

from tests.analysis.test_latency_model import rows

START_PATH = """
import json, sys
import agent.daemon, agent.cli, analysis.change_report, analysis.detector, dashboards.app
dashboards.app.create_app({})
print(json.dumps(sorted(m for m in ("sklearn", "scipy") if m in sys.modules)))
"""

FIT = """
import json, math, sys
from threadpoolctl import threadpool_info
from analysis.latency_model import ExpectedLatency, Row
before = "sklearn" in sys.modules
rows = [Row(**r) for r in json.loads(sys.stdin.read())]
for r in rows:
    object.__setattr__(r, "buckets", tuple((math.inf if b is None else b, n) for b, n in r.buckets))
model = ExpectedLatency(load_allowance=0.0).fit(rows)
print(json.dumps({"before": before, "after": "sklearn" in sys.modules, "slope": model.coef_["mean"][0],
                  "blas": [(p["internal_api"], p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"]}))
"""


def _run(code: str, stdin: str = "") -> object:
    out = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, timeout=120,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_agents_start_path_does_not_import_scikit_learn():
    assert _run(START_PATH) == []


def test_the_first_fit_imports_it_and_every_blas_it_brings_runs_one_thread():
    payload = [{"n": r.n, "rate": r.rate, "tpr": r.tpr, "mean": r.mean, "p50": r.p50, "p99": r.p99,
                "buckets": [(None if b == float("inf") else b, n) for b, n in r.buckets]} for r in rows(0.5, noise=0.02)]
    got = _run(FIT, json.dumps(payload))
    assert got["before"] is False and got["after"] is True
    assert abs(got["slope"] - 0.5) < 0.05  # the fit itself, unchanged
    # numpy's and scipy's OpenBLAS are two libraries: both must be limited, scipy's being loaded only at the fit.
    assert len(got["blas"]) >= 2, got["blas"]
    assert all(threads == 1 for _, threads in got["blas"]), got["blas"]
