"""The benchmark reports: pair ratios and goals, the soak verdict, the agent config per source, the plot."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from agent.config import ProbesConfig, config_from_dict
from benchmarks import plot
from benchmarks.harness import PROBES, SOURCES, BenchError, agent_config
from benchmarks.openloop import Done
from benchmarks.overhead import Phase, summarize
from benchmarks.soak import Reading, verdict


def phase(pair: int, on: bool, tokens: float, server_cpu: float, latencies: list[float],
          agent_cpu: float | None = None) -> Phase:
    p = Phase(source="all", pair=pair, agent_on=on, start=0.0, end=10.0, tokens=tokens, server_cpu=server_cpu,
              agent_cpu=agent_cpu, agent_peak_rss=150 * 2**20 if on else None)
    p.requests = [Done(0.0, lat, 10, True) for lat in latencies]
    return p


def test_summary_ratios_per_pair_and_goals() -> None:
    phases = [phase(0, False, 1000, 5.0, [1.0] * 99 + [2.0]), phase(0, True, 990, 5.0, [1.0] * 99 + [2.02],
                                                                     agent_cpu=0.15),
              phase(1, True, 1000, 5.2, [1.1] * 100, agent_cpu=0.25), phase(1, False, 1000, 5.0, [1.0] * 100)]
    s = summarize(phases)
    assert s["pairs"] == 2
    assert s["throughput_ratio"] == {"median": 0.995, "min": 0.99, "max": 1.0}
    assert s["agent_cpu_percent"] == {"median": 2.0, "min": 1.5, "max": 2.5}
    assert s["cpu_per_token_ratio"]["max"] == pytest.approx(1.04)
    assert s["p99_ratio"]["min"] == pytest.approx(1.01)
    assert s["agent_rss_bytes"] == 150 * 2**20
    assert s["goals"] == {"agent_cpu<=2%": True, "throughput_loss<=1%": True, "p99_increase<=2%": False,
                          "cpu_per_token_within_1%": False, "rss<=200MB": True}


def test_open_loop_throughput_is_served_over_asked_not_the_sides_arrivals() -> None:
    # The 'on' side happened to receive 8 % fewer arrivals and served all of them: no throughput lost. Its raw
    # output ratio (0.92) is the arrivals' ratio, which the summary reports separately.
    off, on = phase(0, False, 1000, 5.0, [1.0]), phase(0, True, 920, 4.6, [1.0], agent_cpu=0.1)
    off.tokens_asked, on.tokens_asked = 1000.0, 920.0
    s = summarize([off, on])
    assert s["throughput_ratio"]["median"] == pytest.approx(1.0)
    assert s["asked_tokens_ratio"]["median"] == pytest.approx(0.92)
    assert s["goals"]["throughput_loss<=1%"] is True
    # A server that falls behind its asks on the 'on' side shows it.
    on.tokens = 850.0
    assert summarize([off, on])["throughput_ratio"]["median"] == pytest.approx(850 / 920, abs=1e-4)


def test_open_loop_counts_the_tokens_each_arrival_asked_for() -> None:
    from benchmarks.openloop import OpenLoop
    load = OpenLoop("http://127.0.0.1:9", rate=1.0)
    load._asked = [(1.0, 16), (2.0, 30), (3.0, 48)]
    assert load.tokens_asked(1.0, 3.0) == 46 and load.tokens_asked(0.0, 10.0) == 94 and load.tokens_asked(4, 5) == 0


def test_pair_missing_a_side_is_not_counted() -> None:
    assert summarize([phase(0, False, 1000, 5.0, [1.0])])["pairs"] == 0


def reading(t: float, rss_mib: float, fds: int = 20, threads: int = 12, late: int = 0) -> Reading:
    return Reading(t=t, rss_bytes=int(rss_mib * 2**20), peak_rss_bytes=int(rss_mib * 2**20), fds=fds, threads=threads,
                   children=1, cpu_percent=1.0, store_bytes=2**20, windows=int(t // 5), late_ticks=late,
                   dropped_windows=0, tick_seconds=0.05)


def test_soak_verdict_measures_growth_after_warmup() -> None:
    flat = [reading(60.0 * i, 100 + (30 if i == 0 else 0)) for i in range(10)]  # compile peak in warm-up only
    v = verdict(flat, retention_bytes=2**30)
    assert v["rss_growth_after_warmup"] == 0.0 and all(v["goals"].values()), v
    leaking = [reading(60.0 * i, 100 + 5 * i, fds=20 + i) for i in range(10)]
    goals = verdict(leaking, retention_bytes=2**30)["goals"]
    assert goals["rss_growth<=10%"] is False and goals["no_fd_growth"] is False and goals["no_thread_growth"]
    assert verdict(flat[:2], 2**30) == {"error": "only 2 readings: run longer than three intervals"}


def test_soak_verdict_ignores_a_momentary_extra_fd_or_thread() -> None:
    blips = [reading(60.0 * i, 100, fds=20 + (2 if i == 5 else 0), threads=12 + (1 if i == 7 else 0))
             for i in range(12)]
    v = verdict(blips, retention_bytes=2**30)
    assert v["fds_max_after"] == 22 and v["threads_max_after"] == 13
    assert v["goals"]["no_fd_growth"] and v["goals"]["no_thread_growth"], v


@pytest.mark.parametrize("source", SOURCES)
def test_agent_config_loads_and_runs_only_its_source(source: str, tmp_path: Path) -> None:
    text = agent_config(source, tmp_path / "store", "127.0.0.1:9999", 4242, "http://127.0.0.1:8000")
    config = config_from_dict(tomllib.loads(text))
    enabled = config.probes.enabled()
    if source == "all":
        assert len(enabled) == 6 and config.stacks.enabled
    elif source == "stacks":
        assert enabled == [] and config.stacks.enabled
    elif source in ("store", "page"):
        assert enabled == [] and not config.stacks.enabled
    else:
        assert enabled == [source] and not config.stacks.enabled
    assert config.targets[0].pid == 4242 and config.targets[0].latency.url == "http://127.0.0.1:8000/metrics"


def test_the_benchmarks_name_the_agents_probes() -> None:
    # The benchmarks do not import the agent (tests/test_layers.py), so they keep their own copy of the names.
    assert list(PROBES) == ProbesConfig().enabled()


def test_unknown_source_is_one_line() -> None:
    with pytest.raises(BenchError, match="unknown source 'gpu'"):
        agent_config("gpu", Path("/x"), "127.0.0.1:1", 1, "http://h:1")


@pytest.mark.browser
def test_plot_renders_a_png_with_chromium(tmp_path: Path) -> None:
    if shutil.which("chromium") is None:
        pytest.fail("chromium is missing; 'make setup' installs Debian's chromium")
    panels = {"RSS MiB": [(0.0, 100.0), (60.0, 101.0), (120.0, 100.5)], "empty": []}
    text = plot.svg("soak", panels)
    assert "<polyline" in text and "no readings" in text
    out = tmp_path / "soak.png"
    assert plot.render_png(text, out, *plot.size(len(panels))) is None
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 2000


def test_agent_config_by_pidfile_for_a_server_that_restarts(tmp_path: Path) -> None:
    text = agent_config("all", tmp_path / "s", "127.0.0.1:1", None, "http://127.0.0.1:8", pidfile=tmp_path / "w.pid")
    (target,) = config_from_dict(tomllib.loads(text)).targets
    assert target.pid is None and target.pidfile == tmp_path / "w.pid"


def test_bench_soak_hands_the_default_retention_bound_to_the_benchmark(monkeypatch) -> None:
    from agent.cli import build_parser
    from agent.config import Config
    from benchmarks import soak

    seen: dict = {}
    monkeypatch.setattr(soak, "main", lambda *args, **kwargs: seen.update(kwargs) or 0)
    args = build_parser().parse_args(["bench", "soak", "--minutes", "1"])
    assert args.func(args) == 0 and seen == {"retention_bytes": Config().retention_bytes}


def test_a_family_server_is_watched_with_its_children(tmp_path: Path) -> None:
    text = agent_config("all", tmp_path / "s", "127.0.0.1:1", 4242, "http://127.0.0.1:8", children=True)
    (target,) = config_from_dict(tomllib.loads(text)).targets
    assert target.pid == 4242 and target.children


def test_bench_overhead_takes_the_server_shape(monkeypatch) -> None:
    from agent.cli import build_parser
    from benchmarks import overhead

    seen: list = []
    monkeypatch.setattr(overhead, "main", lambda *args, **kw: seen.append((args, kw)) or 0)
    args = build_parser().parse_args(["bench", "overhead", "--server", "gunicorn"])
    assert args.func(args) == 0 and seen[0][0][-1] == "gunicorn"
    # Past warm-up unless asked for fresh agents.
    assert seen[0][1] == {"warm": True, "otlp": False}
    args = build_parser().parse_args(["bench", "overhead", "--cold"])
    assert args.func(args) == 0 and seen[1][1] == {"warm": False, "otlp": False}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "overhead", "--server", "uwsgi"])


def test_summary_splits_pyspy_into_bursts_and_counts_bursts_per_hour() -> None:
    on0 = phase(0, True, 990, 5.0, [1.0], agent_cpu=0.2)
    on0.agent_own_cpu, on0.burst_share, on0.bursts = 0.1, 0.5, 1  # 1 % of a core, half of py-spy's 1 % in bursts
    on1 = phase(1, True, 990, 5.0, [1.0], agent_cpu=0.1)
    on1.agent_own_cpu, on1.burst_share, on1.bursts = 0.06, None, 0  # no recorder seen: no burst CPU
    s = summarize([phase(0, False, 1000, 5.0, [1.0]), on0, phase(1, False, 1000, 5.0, [1.0]), on1])
    assert s["burst_cpu_percent"] == {"median": 0.25, "min": 0.0, "max": 0.5}
    assert s["bursts_per_hour"] == 180.0  # one burst in 20 s of agent-on sides
    assert s["agent_children_cpu_percent"]["max"] == pytest.approx(1.0)
