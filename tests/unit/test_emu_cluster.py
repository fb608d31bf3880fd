"""The emulated cluster (emucluster/) and the link-rate sweep, in the parts that run without root:
argument handling, the rsh agent's and the launcher's command lines, refusals, the self-check's verdict,
the cost model and the sweep page.  (Setting the cluster up needs root; `emu-cluster selfcheck` and
`make bench-cluster` exercise that.)"""
import json
import os
import shutil

import pytest

import bench_cluster  # bench/ is on pytest's pythonpath (pyproject.toml)
from emucluster import cluster as emu, costmodel

from tests.conftest import REPO


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv(emu.ENV_STATE_DIR, str(tmp_path))
    st = emu.layout(2, str(tmp_path))
    st["rate_bps"], st["delay_s"] = 100_000_000, None
    emu.write_state(st)
    return st


# ---- parsing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,bps", [("25mbit", 25_000_000), ("1gbit", 10**9), ("2.5gbit", 2_500_000_000),
                                      ("500kbit", 500_000), ("100MBIT", 10**8), ("unshaped", None), ("none", None)])
def test_parse_rate(text, bps):
    assert emu.parse_rate(text) == bps


@pytest.mark.parametrize("text,words", [("100mbps", "ambiguous"), ("100M", "ambiguous"), ("fast", "not understood"),
                                        ("10bit", "outside"), ("200gbit", "outside"), ("-5mbit", "not understood")])
def test_parse_rate_rejects_with_a_reason(text, words):
    with pytest.raises(ValueError, match=words):
        emu.parse_rate(text)


def test_format_rate_round_trips():
    for text in ("25mbit", "1gbit", "250mbit", "500kbit", "unshaped"):
        assert emu.format_rate(emu.parse_rate(text)) == text


def test_parse_delay():
    assert emu.parse_delay("5ms") == pytest.approx(0.005)
    assert emu.parse_delay("100us") == pytest.approx(1e-4)
    for bad in ("5", "fast", "0ms", "20s"):
        with pytest.raises(ValueError):
            emu.parse_delay(bad)


def test_qdisc_commands():
    (tbf,) = emu.qdisc_commands("gemu-s0", "gemu0", 100_000_000)
    assert tbf[:4] == ["ip", "netns", "exec", "gemu-s0"]
    assert tbf[4:] == ["tc", "qdisc", "replace", "dev", "gemu0", "root", "tbf", "rate", "100000000bit",
                       "burst", str(emu.tbf_burst_bytes(100_000_000)), "latency", emu.TBF_LATENCY]
    assert emu.tbf_burst_bytes(25_000_000) == 64 * 1024          # floor: one GSO packet fits
    assert emu.tbf_burst_bytes(10**9) == 125_000                 # 1 ms of traffic
    (unshaped,) = emu.qdisc_commands("gemu-s1", "gemu0", None)
    assert unshaped[4:] == ["tc", "qdisc", "del", "dev", "gemu0", "root"]
    (netem,) = emu.qdisc_commands("gemu-s1", "gemu0", 10**9, delay_s=0.005)
    assert netem[4:] == ["tc", "qdisc", "replace", "dev", "gemu0", "root", "netem", "delay", "5000us",
                         "rate", "1000000000bit"]


def test_layout_veth_for_two_bridge_for_more(tmp_path):
    two = emu.layout(2, str(tmp_path))
    assert not two["bridge"] and two["egress"] == [("gemu-s0", "gemu0"), ("gemu-s1", "gemu0")]
    assert [h["address"] for h in two["hosts"]] == ["10.213.0.1", "10.213.0.2"]
    assert [h["hostname"] for h in two["hosts"]] == ["emu-s0", "emu-s1"]
    four = emu.layout(4, str(tmp_path))
    assert four["bridge"] and len(four["egress"]) == 8          # server side and bridge side of each port
    assert ("gemu-hub", "gemup3") in four["egress"]
    assert all(h["address"].startswith("10.213.0.") for h in four["hosts"])
    for bad in (1, 0, 17, "2"):
        with pytest.raises(ValueError, match="--servers"):
            emu.layout(bad, str(tmp_path))


# ---- the rsh agent and the launcher ------------------------------------------------------------

ORTED = ["orted", "-mca", "ess", '"env"', "-mca", "orte_hnp_uri", '"1.0;tcp://10.213.0.1:42277"']


def test_agent_enters_the_target_servers_namespaces(state):
    cmd = emu.agent_argv(["emu-s1", *ORTED], state)
    uts = os.path.join(state["state_dir"], "uts-emu-s1")
    assert cmd == ["nsenter", "--net=/run/netns/gemu-s1", f"--uts={uts}", "--", "/bin/sh", "-c", " ".join(ORTED)]
    # ssh-style leading options are skipped; user@host and the server's address name it too
    assert emu.agent_argv(["-x", "root@emu-s1", *ORTED], state) == cmd
    assert emu.agent_argv(["10.213.0.2", *ORTED], state) == cmd
    assert emu.agent_argv(["emu-s0", "true"], state)[1] == "--net=/run/netns/gemu-s0"


def test_agent_refuses_unknown_host_and_missing_command(state):
    with pytest.raises(emu.EmuError, match="not a server of the emulated cluster.*emu-s0, emu-s1") as e:
        emu.agent_argv(["node07", "orted"], state)
    assert e.value.code == 255                                   # what ssh returns: mpirun reports it
    with pytest.raises(emu.EmuError, match="expected HOST COMMAND"):
        emu.agent_argv(["emu-s1"], state)
    with pytest.raises(emu.EmuError, match="empty command"):
        emu.agent_argv(["emu-s1", " "], state)


def test_agent_main_execs_the_command(state, monkeypatch):
    seen = []
    monkeypatch.setattr(emu.os, "execvp", lambda f, argv: seen.append((f, argv)))
    emu.main(["agent", "emu-s1", "orted", "-mca", "x"])
    assert seen and seen[0][0] == "nsenter" and seen[0][1][-1] == "orted -mca x"


def test_launcher_command_line(state):
    env = {"OMP_NUM_THREADS": "1", "GRANNDIS_RANKS_PER_SERVER": "2", "HOME": "/root"}
    cmd, extra = emu.launcher_argv(["-n", "4", "python", "train.py", "--x"], state, 300, env=env)
    assert cmd[:4] == ["timeout", "--kill-after=15", "300", "nsenter"]
    assert "--net=/run/netns/gemu-s0" in cmd                     # mpirun itself runs in server 0
    mpi = cmd[cmd.index("mpirun"):]
    assert mpi[:5] == ["mpirun", "-n", "4", "--host", "emu-s0:2,emu-s1:2"]
    pairs = {mpi[i + 1]: mpi[i + 2] for i, a in enumerate(mpi[:-2]) if a == "--mca"}
    assert pairs["plm_rsh_agent"] == os.path.join(REPO, "emucluster", "rsh-agent")
    assert pairs["pml"] == "ob1" and pairs["btl"] == "tcp,self,vader"
    assert pairs["btl_tcp_if_include"] == pairs["oob_tcp_if_include"] == "10.213.0.0/24"
    exported = {mpi[i + 1] for i, a in enumerate(mpi[:-1]) if a == "-x"}
    assert {"MASTER_ADDR", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "GRANNDIS_RANKS_PER_SERVER"} <= exported
    assert "HOME" not in exported
    assert extra["MASTER_ADDR"] == "10.213.0.1" and extra["GLOO_SOCKET_IFNAME"] == "gemu0"
    assert mpi[-3:] == ["python", "train.py", "--x"]
    cmd2, _ = emu.launcher_argv(["-np=6", "prog"], state, 60, env={})
    assert "emu-s0:3,emu-s1:3" in cmd2


@pytest.mark.parametrize("argv,words", [(["-n", "3", "prog"], "multiple of 2"), (["prog"], "-n N"),
                                        (["-n", "4"], "no program"), (["-n", "x", "p"], "not a number"),
                                        (["-n"], "needs a number")])
def test_launcher_rejects_bad_arguments(state, argv, words):
    with pytest.raises(ValueError, match=words):
        emu.launcher_argv(argv, state, 60, env={})


def test_emu_mpirun_without_a_cluster_says_how_to_make_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(emu.ENV_STATE_DIR, str(tmp_path / "none"))
    monkeypatch.setattr(emu, "preflight", lambda: None)
    assert emu.main(["mpirun", "-n", "4", "prog"]) == emu.EXIT_USAGE
    assert "emu-cluster setup --servers 2" in capsys.readouterr().err


def test_emu_mpirun_bad_n_is_a_usage_error(state, monkeypatch, capsys):
    monkeypatch.setattr(emu, "preflight", lambda: None)
    assert emu.main(["mpirun", "-n", "3", "prog"]) == emu.EXIT_USAGE
    assert "cannot be spread evenly" in capsys.readouterr().err
    assert emu.main(["mpirun", "--emu-timeout", "soon", "-n", "4", "prog"]) == emu.EXIT_USAGE


# ---- refusals ----------------------------------------------------------------------------------

def test_preflight_refuses_without_root_tools_or_linux():
    have = lambda tool: "/usr/bin/" + tool  # noqa: E731
    with pytest.raises(emu.EmuError, match="needs root.*CAP_NET_ADMIN") as e:
        emu.preflight(euid=1000, which=have, platform="linux")
    assert e.value.code == emu.EXIT_REFUSED
    with pytest.raises(emu.EmuError, match=r"missing tools: tc \(Debian package iproute2\)"):
        emu.preflight(euid=0, which=lambda t: None if t == "tc" else have(t), platform="linux")
    with pytest.raises(emu.EmuError, match="needs Linux"):
        emu.preflight(euid=0, which=have, platform="darwin")
    emu.preflight(euid=0, which=have, platform="linux")         # all there: no error


def test_setup_without_root_exits_3_with_the_reason(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(emu.ENV_STATE_DIR, str(tmp_path))
    monkeypatch.setattr(emu.os, "geteuid", lambda: 1000)
    assert emu.main(["setup", "--servers", "2", "--rate", "100mbit"]) == emu.EXIT_REFUSED
    assert "needs root" in capsys.readouterr().err
    assert emu.main(["setup", "--rate", "100mbps"]) == emu.EXIT_USAGE       # bad input before privileges
    assert "ambiguous" in capsys.readouterr().err
    assert emu.main(["setup", "--servers", "1"]) == emu.EXIT_USAGE
    assert emu.main(["session", "--rate", "1gbit"]) == emu.EXIT_USAGE       # no command


class FakeRun:
    def __init__(self, rc=0, stderr=""):
        self.calls, self.rc, self.stderr = [], rc, stderr

    def __call__(self, cmd, check=True, timeout=None):
        self.calls.append(cmd)
        return type("P", (), {"returncode": self.rc, "stderr": self.stderr, "stdout": ""})()


def test_delay_without_netem_is_refused_clearly(state, monkeypatch):
    monkeypatch.setattr(emu, "_run", FakeRun(2, "Error: Specified qdisc kind is unknown."))
    with pytest.raises(emu.EmuError, match="no netem qdisc.*--delay cannot be emulated.*run without --delay") as e:
        emu.apply_shaping(state, 10**8, delay_s=0.005)
    assert e.value.code == emu.EXIT_REFUSED


def test_shaping_every_egress_and_unshaping_an_unshaped_link(state, monkeypatch):
    fake = FakeRun()
    monkeypatch.setattr(emu, "_run", fake)
    emu.apply_shaping(state, 25_000_000)
    assert [c[3] for c in fake.calls] == ["gemu-s0", "gemu-s1"] and all("tbf" in c for c in fake.calls)
    assert emu.read_state()["rate_bps"] == 25_000_000             # the state file follows the link
    monkeypatch.setattr(emu, "_run", FakeRun(2, "Error: Cannot delete qdisc with handle of zero."))
    emu.apply_shaping(state, None)                                # nothing to remove: fine
    assert emu.read_state()["rate_bps"] is None
    monkeypatch.setattr(emu, "_run", FakeRun(2, "RTNETLINK answers: Operation not permitted"))
    with pytest.raises(emu.EmuError, match="Operation not permitted"):
        emu.apply_shaping(state, 10**8)


# ---- the self-check's verdict ------------------------------------------------------------------

def measurement(inter_MBps, intra_MBps=340.0, hosts=("emu-s0", "emu-s0", "emu-s1", "emu-s1")):
    return {"hosts": list(hosts), "intra_Bps": intra_MBps * 1e6, "inter_Bps": {"1": inter_MBps * 1e6},
            "bytes": 1 << 20, "reps": 3}


def test_selfcheck_verdict():
    rate = 100_000_000                                            # 12.5 MB/s
    assert emu.check_measurement(measurement(11.0), 2, 2, rate) == []
    (too_fast,) = emu.check_measurement(measurement(15.0), 2, 2, rate)
    assert "1.20x" in too_fast and "not shaped" in too_fast
    (too_slow,) = emu.check_measurement(measurement(5.0), 2, 2, rate)
    assert "0.40x" in too_slow
    one_host = emu.check_measurement(measurement(11.0, hosts=("vm",) * 4), 2, 2, rate)
    assert any("sees 1 host" in p for p in one_host)
    (no_shm,) = emu.check_measurement(measurement(11.0, intra_MBps=12.0), 2, 2, rate)
    assert "shared memory" in no_shm
    assert emu.check_measurement(measurement(140.0), 2, 2, None) == []   # unshaped: nothing to hold


# ---- cost model and sweep ----------------------------------------------------------------------

def record(epoch, time_s, compute, inter, intra=0.01, grad=0.01, inter_bytes=10**6, test_acc=None):
    r = {"epoch": epoch, "time_s": time_s, "compute_s": compute, "inter_comm_s": inter, "intra_comm_s": intra,
         "grad_sync_s": grad, "sampling_s": 0.0, "loss": 1.0,
         "bytes": {"intra_halo": 500, "inter_halo": inter_bytes, "intra_grad": 10, "inter_grad": 20},
         "max_rank_bytes": {"intra_halo": 300, "inter_halo": inter_bytes // 2 + 7, "intra_grad": 5, "inter_grad": 20},
         "inter_bytes_per_server": [inter_bytes // 2 - 7, inter_bytes // 2 + 27],
         "rows_per_layer": [{"rank": 0, "rows_computed": [30, 20, 10]}, {"rank": 1, "rows_computed": [40, 20, 5]}]}
    if test_acc is not None:
        r["test_acc"] = test_acc
    return r


def test_summarize_run_leaves_out_the_first_epoch():
    recs = [record(0, 9.0, 8.0, 1.0), record(1, 1.0, 0.5, 0.4), record(2, 2.0, 0.7, 1.2),
            record(3, 1.2, 0.6, 0.5, test_acc=0.42)]
    s = costmodel.summarize_run(recs)
    assert s["epoch_s"] == 1.2 and s["compute"] == 0.6 and s["inter_comm"] == 0.5 and s["epochs_used"] == 3
    assert s["test_acc"] == 0.42 and s["bytes"]["inter_halo"] == 10**6
    # the cost model's exact counts: rows over ranks and layers (x steps), the busiest server and rank
    assert s["rows"] == 125 and costmodel.summarize_run(recs, steps=2)["rows"] == 250
    assert s["inter_bytes_max_server"] == 10**6 // 2 + 27 and s["intra_bytes_max_rank"] == 305
    old = [{k: v for k, v in r.items() if k not in ("rows_per_layer", "max_rank_bytes", "inter_bytes_per_server")}
           for r in recs]
    assert costmodel.summarize_run(old)["rows"] is None
    with pytest.raises(ValueError):
        costmodel.summarize_run([])


def model_run(epoch, rows, inter_max, intra_max=0, inter_total=None):
    return {"epoch_s": epoch, "rows": rows, "inter_bytes_max_server": inter_max, "intra_bytes_max_rank": intra_max,
            "compute": 0.3, "sampling": 0.0, "intra_comm": 0.1, "grad_sync": 0.05, "inter_comm": 0.0,
            "bytes": {"intra_halo": 0, "inter_halo": inter_total or 2 * inter_max, "intra_grad": 0, "inter_grad": 0},
            "test_acc": 0.5}


K = {"fb": 2e-6, "flx": 1e-6, "eas": 1.5e-6}   # cost per row of each mode (s) at load factor 1
ROWS = {"fb": 1000, "flx": 3000, "eas": 2000}
BYTES = {"fb": (10**7, 10**6), "flx": (1000, 0), "eas": (1000, 0)}   # (busiest server inter, busiest rank intra)


def one_round(label, bw, load, off=None, bps=None):
    """fb, flx, eas whose epochs are exactly rows * k * load + wire time; `off` = (mode, factor on its epoch)."""
    runs = {}
    for m in K:
        inter, intra = BYTES[m]
        epoch = ROWS[m] * K[m] * load + inter / bw + intra / 1e9
        runs[m] = model_run(epoch * (off[1] if off and off[0] == m else 1.0), ROWS[m], inter, intra)
    return {"label": label, "rate_bps": bps, "bw_Bps": bw, "pingpong": {"intra_Bps": 1e9}, "runs": runs}


def test_cost_model_predicts_each_run_from_the_others():
    # the load drifts: the unshaped round computes 3x slower than the 100mbit one
    rounds = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, bps=10**8),
              one_round("25mbit", 2.5e6, 2.0, bps=25 * 10**6)]
    fit = costmodel.model_sweep(rounds, servers=2)
    for rnd in rounds:
        for mode, run in rnd["runs"].items():
            assert run["model_error"] == pytest.approx(0.0, abs=1e-6), (rnd["label"], mode)
    assert fit["load_factor"] == pytest.approx([1.0, 1 / 3, 2 / 3])
    assert fit["cost_per_row_s"] == pytest.approx({m: 3 * k for m, k in K.items()})
    fb = rounds[1]["runs"]["fb"]
    assert fb["wire_s"] == pytest.approx(10**7 / 1e7 + 10**6 / 1e9)   # busiest server / inter + busiest rank / intra
    # a ping-pong above the shaped rate's TCP payload (a free tbf burst per message) is capped at it
    fast = dict(rounds[2], bw_Bps=3.2e6)
    assert costmodel.link_bandwidth(fast) == pytest.approx(25e6 / 8 * 1448 / 1514)
    assert costmodel.link_bandwidth(rounds[2]) == 2.5e6 and costmodel.link_bandwidth(rounds[0]) == 1e8
    # the previous model takes every round's local seconds from the unshaped run: off by more than 25 %
    assert rounds[1]["runs"]["flx"]["model_error_unshaped"] > 0.25


def test_cost_model_never_calibrates_a_run_on_itself():
    # fb at 100mbit took twice what the others predict: that run shows the error, the others stay exact-ish
    rounds = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, off=("fb", 2.0), bps=10**8),
              one_round("25mbit", 2.5e6, 2.0, bps=25 * 10**6)]
    costmodel.model_sweep(rounds, servers=2)
    fb = rounds[1]["runs"]["fb"]
    assert fb["model_error"] == pytest.approx((fb["predicted_s"] - fb["epoch_s"]) / fb["epoch_s"])
    # fb's cost per row comes from its other rounds, the round's load from flx and eas: the true epoch
    assert fb["predicted_s"] == pytest.approx(fb["epoch_s"] / 2)
    assert rounds[0]["runs"]["flx"]["model_error"] != pytest.approx(0.0, abs=1e-3)  # its fit saw the bad run


def test_cost_model_refuses_what_it_cannot_compute():
    two = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, bps=10**8)]
    with pytest.raises(ValueError, match="include 'unshaped'"):
        costmodel.model_sweep([two[1], one_round("50mbit", 5e6, 1.0, bps=5 * 10**7)], servers=2)
    with pytest.raises(ValueError, match="at least 2 modes and 2 rounds"):
        costmodel.model_sweep(two[:1], servers=2)
    with pytest.raises(ValueError, match="inter-server bandwidth must be positive"):
        costmodel.model_sweep([dict(two[0], bw_Bps=0), two[1]], servers=2)
    two[0]["runs"]["flx"]["rows"] = None
    with pytest.raises(ValueError, match="no rows_per_layer"):
        costmodel.model_sweep(two, servers=2)


def test_speedups_and_the_paper_share():
    fb = dict(model_run(1.45, 1000, 10**7), inter_comm=1.0)
    rate = {"label": "100mbit", "runs": {"fb": fb, "flx": model_run(0.5, 3000, 1000)}}
    unshaped = {"label": "unshaped", "runs": {"fb": dict(fb, epoch_s=0.6, inter_comm=0.1), "flx": rate["runs"]["flx"]}}
    assert costmodel.speedups(rate)["flx"] == pytest.approx(1.45 / 0.5)
    assert costmodel.inter_share(fb) == pytest.approx(1.0 / 1.45)
    assert costmodel.paper_like_rates([unshaped, rate]) == ["100mbit"]  # 69 % is in 44-86 %; 17 % is not


def test_sweep_rounds_alternate_fast_and_slow_then_repeat_unshaped():
    rates = bench_cluster.parse_rates(bench_cluster.DEFAULT_RATES)
    assert [label for label, _, _ in bench_cluster.round_order(rates)] == [
        "unshaped", "25mbit", "1gbit", "50mbit", "250mbit", "100mbit", "unshaped-repeat"]
    assert bench_cluster.round_order(rates, repeat=False)[-1] == ("100mbit", 10**8, False)
    assert bench_cluster.round_order(rates[:1]) == [("unshaped", None, False), ("unshaped-repeat", None, True)]


def test_sweep_page_flags_a_model_error_over_25_percent():
    rounds = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, off=("flx", 2.0), bps=10**8)]
    repeat = [one_round("unshaped-repeat", 1e8, 2.0)]
    for i, r in enumerate(rounds + repeat):
        r.update(round=i, loadavg_1min=3.0 + i)
    sweep = {"date": "2026-12-01", "modes": ["fb", "flx", "eas"], "rates": rounds, "repeat": repeat, "log": ["cmd one"],
             "graph": {"vertices": 20000, "layers": 3, "hidden": 64, "epochs": 5},
             "loadavg_start": [3.0, 2.5, 2.0], "loadavg_end": [5.0, 4.0, 3.0]}
    sweep["model_fit"] = costmodel.model_sweep(bench_cluster.all_rounds(sweep), servers=2)
    page = bench_cluster.render(sweep, ["--epochs", "5"])
    (off,) = [line for line in page.splitlines() if line.startswith("Largest error: ")]
    assert "flx at 100mbit" in off and "fb at" not in off   # a 2x slow flx run is flagged, fb is wire time
    assert "before the sweep: 3.0 / 2.5 / 2.0; after: 5.0 / 4.0 / 3.0" in page
    assert "| 2 | unshaped-repeat | 5.0 |" in page and "| flx | 3,000 |" in page
    assert "python bench/bench_cluster.py --epochs 5" in page and "cmd one" in page
    ok = [one_round("unshaped", 1e8, 3.0), one_round("100mbit", 1e7, 1.0, bps=10**8)]
    costmodel.model_sweep(ok, servers=2)
    assert "Every prediction is within 25 %" in bench_cluster.render(dict(sweep, rates=ok, repeat=[]), [])


def test_sweep_modes_and_rates():
    assert bench_cluster.parse_modes("flx,fb,eas") == ["fb", "flx", "eas"]
    for bad, words in (("flx,eas", "must include fb"), ("fb,flx-k9", "unknown mode"), ("fb,fb", "twice")):
        with pytest.raises(ValueError, match=words):
            bench_cluster.parse_modes(bad)
    assert bench_cluster.parse_rates("25mbit,unshaped,1gbit") == [("unshaped", None), ("1gbit", 10**9),
                                                                   ("25mbit", 25_000_000)]
    with pytest.raises(ValueError, match="must include 'unshaped'"):
        bench_cluster.parse_rates("25mbit,1gbit")
    with pytest.raises(ValueError, match="twice"):
        bench_cluster.parse_rates("unshaped,1gbit,1000mbit")
    # every mode names a shard set that exists, and the k < L rows are there to switch on
    assert all(shards in bench_cluster.SHARD_SETS for shards, _, _ in bench_cluster.MODES.values())
    assert {"flx-k1", "flx-k2"} <= set(bench_cluster.MODES)


def test_sweep_refuses_without_root(monkeypatch, capsys):
    monkeypatch.setattr(emu.os, "geteuid", lambda: 1000)
    assert bench_cluster.main(["--rates", "unshaped,100mbit"]) == emu.EXIT_REFUSED
    assert "needs root" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_cluster.main(["--rates", "100mbit"])               # usage error before privileges
    assert "must include 'unshaped'" in capsys.readouterr().err


def test_state_file_errors_are_clear(tmp_path, monkeypatch):
    monkeypatch.setenv(emu.ENV_STATE_DIR, str(tmp_path))
    (tmp_path / "state.json").write_text("{not json")
    with pytest.raises(emu.EmuError, match="teardown"):
        emu.read_state()
    st = emu.layout(2, str(tmp_path))
    emu.write_state(st)
    assert json.loads((tmp_path / "state.json").read_text())["servers"] == 2


# ---- granndis report --sweep -------------------------------------------------------------------

LINKS = (("unshaped", None, 1.4e8, 0.6), ("25mbit", 25_000_000, 2.9e6, 4.0), ("100mbit", 10**8, 1.1e7, 1.5))


def write_sweep(root, modes=("fb", "flx", "eas")):
    """Run directories as bench_cluster.py leaves them: ROOT/LABEL/MODE, each with its link.json."""
    from tests.unit.test_report import write_run
    for label, bps, bw, fb_s in LINKS:
        (root / label).mkdir(parents=True)
        for m in modes:
            run, summary = write_run(root / label, m, m)
            (run / "summary.json").write_text(json.dumps({**summary, "epoch_time_s": fb_s if m == "fb" else 0.5}))
            (run / "link.json").write_text(json.dumps({"label": label, "rate_bps": bps, "bw_Bps": bw,
                                                       "intra_Bps": 1e9}))
    return root


def test_report_sweep_plots_speedup_against_rate(tmp_path, capsys):
    from granndis_hpc.report import main as report_main
    path = write_sweep(tmp_path / "runs")
    out = tmp_path / "rep"
    assert report_main(["--sweep", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    with open(out / "speedup_vs_rate.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    lines = [ln for ln in printed.splitlines() if ln.startswith("| ")]
    # sorted by rate: 25 Mbit/s, 100 Mbit/s, then unshaped at its measured 1,120 Mbit/s
    assert lines[1].split("|")[1].strip() == "25mbit" and "8.00x" in lines[1]
    assert "100mbit" in lines[2] and "3.00x" in lines[2]
    assert "unshaped (measured)" in lines[3] and "1,120" in lines[3] and "1.20x" in lines[3]
    assert (out / "speedup_vs_rate.md").read_text().count("8.00x") == 2   # flx and eas


def test_report_sweep_errors(tmp_path, capsys):
    from granndis_hpc.report import main as report_main
    assert report_main(["--sweep", str(write_sweep(tmp_path / "a", modes=("flx", "eas")))]) == 2
    assert "no run named 'fb'" in capsys.readouterr().err
    assert report_main(["--sweep", str(tmp_path / "missing")]) == 2
    assert "no run directories" in capsys.readouterr().err
    bad = write_sweep(tmp_path / "b")
    shutil.rmtree(bad / "25mbit" / "eas")
    assert report_main(["--sweep", str(bad)]) == 2
    assert "link '25mbit': no run of 'eas'" in capsys.readouterr().err
    os.remove(bad / "100mbit" / "flx" / "link.json")
    assert report_main(["--sweep", str(bad)]) == 2
    assert "no link.json" in capsys.readouterr().err
    (bad / "100mbit" / "flx" / "link.json").write_text(json.dumps({"label": "100mbit", "bw_Bps": 0, "intra_Bps": 1}))
    assert report_main(["--sweep", str(bad)]) == 2
    assert "'bw_Bps' must be a positive number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report_main([])                                          # neither runs nor --sweep
    with pytest.raises(SystemExit):
        report_main(["somerun", "--sweep", str(bad)])


def test_selfcheck_low_bound_follows_the_machines_capacity():
    gbit = 10**9                                                  # 125 MB/s: more than 2 busy cores drive
    (slow,) = emu.check_measurement(measurement(57.0, intra_MBps=600), 2, 2, gbit)
    assert "0.46x" in slow and "too busy" in slow
    assert emu.check_measurement(measurement(57.0, intra_MBps=600), 2, 2, gbit, capacity_Bps=100e6) == []
    problems, fatal = emu.check_measurement(measurement(20.0, intra_MBps=600), 2, 2, gbit, capacity_Bps=100e6,
                                            with_fatal=True)
    assert problems and "unshaped capacity" in problems[0] and not fatal    # load: worth a retry
    problems, fatal = emu.check_measurement(measurement(15.0), 2, 2, 10**8, with_fatal=True)
    assert problems and fatal                                     # faster than the limit: shaping is off


def test_run_bounded_passes_a_stop_on_to_the_child(tmp_path, monkeypatch):
    """A stop (KeyboardInterrupt, as SIGTERM becomes) must end the child, not orphan it."""
    import subprocess
    import time
    marker = tmp_path / "pid"
    real_popen = subprocess.Popen
    procs = []

    def popen(*a, **kw):
        p = real_popen(*a, **kw)
        procs.append(p)
        return p
    monkeypatch.setattr(emu.subprocess, "Popen", popen)

    def interrupt_soon(self, *a, **kw):
        time.sleep(0.3)
        raise KeyboardInterrupt("signal 15")
    monkeypatch.setattr(real_popen, "communicate", interrupt_soon)
    with pytest.raises(KeyboardInterrupt):
        emu.run_bounded(["sh", "-c", f"echo $$ > {marker}; exec sleep 30"], grace_s=5)
    assert procs and procs[0].poll() is not None                  # the child was ended and reaped
    assert procs[0].returncode == -15                             # by SIGTERM first, not SIGKILL


def test_run_bounded_returns_like_subprocess_run():
    p = emu.run_bounded(["sh", "-c", "echo hi; exit 3"], capture=True)
    assert (p.returncode, p.stdout) == (3, "hi\n")


# ---- instances: a second emulated cluster beside the default one ----------------------------------

def test_default_instance_keeps_its_names(monkeypatch, tmp_path):
    monkeypatch.delenv(emu.ENV_INSTANCE, raising=False)
    monkeypatch.delenv(emu.ENV_STATE_DIR, raising=False)
    assert emu.state_dir() == "/run/granndis-emu"
    st = emu.layout(4, str(tmp_path))
    assert [h["netns"] for h in st["hosts"]] == ["gemu-s0", "gemu-s1", "gemu-s2", "gemu-s3"]
    assert st["subnet"] == "10.213.0.0/24" and st["ifname"] == "gemu0" and st["hosts"][1]["hostname"] == "emu-s1"
    assert ("gemu-hub", "gemup3") in st["egress"]


def test_named_instance_shares_no_name_with_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv(emu.ENV_INSTANCE, "slurm")
    monkeypatch.delenv(emu.ENV_STATE_DIR, raising=False)
    monkeypatch.delenv(emu.ENV_SUBNET, raising=False)
    assert emu.state_dir() == "/run/granndis-emu-slurm"
    st = emu.layout(4, str(tmp_path))
    assert [h["netns"] for h in st["hosts"]][:2] == ["gslurm-s0", "gslurm-s1"]
    assert [h["address"] for h in st["hosts"]][:2] == ["10.214.0.1", "10.214.0.2"]
    assert st["hosts"][0]["hostname"] == "slurm-s0" and st["ifname"] == "gslurm0"
    assert ("gslurm-hub", "gslurmp3") in st["egress"]
    default = emu.instance_names("")
    # the default instance's teardown (prefix gemu-s + digits, gemu-hub, gemu-probe) cannot match ours
    assert not any(n.startswith(default["ns_prefix"]) or n in (default["hub_ns"], default["probe_ns"])
                   for n in [h["netns"] for h in st["hosts"]] + ["gslurm-hub", "gslurm-probe"])
    monkeypatch.setenv(emu.ENV_SUBNET, "10.220.7")
    assert emu.layout(2, str(tmp_path))["subnet"] == "10.220.7.0/24"
    for bad in ("emu", "Slurm", "a-b", "toolongname"):
        with pytest.raises(emu.EmuError, match="instance"):
            emu.instance_names(bad)
    monkeypatch.setenv(emu.ENV_SUBNET, "192.168.0")
    with pytest.raises(emu.EmuError, match="GRANNDIS_EMU_SUBNET"):
        emu.instance_names("slurm")


def test_instance_option_sets_the_environment(monkeypatch, capsys):
    monkeypatch.delenv(emu.ENV_INSTANCE, raising=False)
    monkeypatch.setenv(emu.ENV_STATE_DIR, "/nonexistent-granndis")
    assert emu.main(["--instance", "slurm", "status"]) == emu.EXIT_USAGE  # no cluster set up there
    assert os.environ[emu.ENV_INSTANCE] == "slurm"
    assert emu.main(["--instance", "emu", "status"]) == emu.EXIT_USAGE
    assert "not 'emu'" in capsys.readouterr().err


def _counted(run):
    """3 sage layers on the world view (fb), 1000 rows each, 100 send rows, 1,000 of 10,000 edges from
    halo rows (the overlap limit's per-layer counts, granndis_hpc/linkmodel.py)."""
    run["layers"], run["model"], run["overlap"], run["overlap_halos"] = 3, "sage", True, ["world"]
    run["layer_counts"] = [{"group": "world", "rows_computed": 1000, "rows_held": 1200, "send_rows": 100,
                            "halo_rows": 200, "edges": 10_000, "halo_edges": 1_000}] * 3
    return run


def test_the_sweep_model_uses_the_product_overlap_limit():
    """costmodel.overlap_limit is linkmodel's (tests/unit/test_linkmodel.py works it by hand): compute
    0.6 s (0.1 s per layer and direction), 1 s of halo wire (0.25 s per exchange), windows 0.099 s and
    0.18 s, gradient wire additive."""
    run = _counted(model_run(2.0, 1000, inter_max=10**7 + 500, intra_max=0))
    run["bytes"]["inter_grad"] = 1000  # 500 per leader on 2 servers
    bw = (1e7, 1e9)
    grad_wire = 500 / 1e7
    assert costmodel.overlap_limit(run, 0.6, bw, servers=2) == pytest.approx(0.6 + 0.302 + 0.14 + grad_wire)
    run["overlap"] = False  # a --no-overlap run: the additive compute + wire
    assert costmodel.overlap_limit(run, 0.6, bw, servers=2) == pytest.approx(1.6 + grad_wire)


def test_one_rank_per_server_needs_no_intra_link():
    """2 servers x 1 rank (bench_cluster.py --ranks-per-server 1): no intra-server bytes, no intra
    bandwidth measured; the wire and the overlap limit are the inter-server terms alone."""
    from granndis_hpc.linkmodel import wire_s
    run = _counted(model_run(2.0, 1000, inter_max=10**7 + 500, intra_max=0))
    run["bytes"]["inter_grad"], run["bytes"]["intra_grad"] = 1000, 0
    assert wire_s(run, 1e7, None) == pytest.approx((10**7 + 500) / 1e7)
    assert costmodel.overlap_limit(run, 0.6, (1e7, None), servers=2) == pytest.approx(1.042 + 500 / 1e7)
    run["intra_bytes_max_rank"] = 10
    with pytest.raises(ValueError, match="intra-server"):
        wire_s(run, 1e7, None)
