"""The emulated cluster (emucluster/) and the link-rate sweep, in the parts that run without root:
argument handling, the rsh agent's and the launcher's command lines, refusals, the self-check's verdict,
the instances.  The cost model and the sweep: test_cost_model_sweep.py.  (Setting the cluster up needs root;
`emu-cluster selfcheck` and
`make bench-cluster` exercise that.)"""
import os

import pytest

from emucluster import cluster as emu

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


def test_launcher_yields_when_ranks_outnumber_the_cores(state, monkeypatch):
    """Open MPI believes each emulated server's slots: emu-mpirun asks waiting ranks to yield the core when
    the job's ranks outnumber the machine's, as mpirun does on one oversubscribed node; the environment's
    own setting wins."""
    def yields(n, cores, env):
        monkeypatch.setattr(emu.os, "cpu_count", lambda: cores)
        cmd, _ = emu.launcher_argv(["-n", str(n), "prog"], state, 60, env=env)
        mpi = cmd[cmd.index("mpirun"):]
        return {mpi[i + 1]: mpi[i + 2] for i, a in enumerate(mpi[:-2]) if a == "--mca"}.get("mpi_yield_when_idle")
    assert yields(4, 2, {}) == "1" and yields(6, 4, {}) == "1"
    assert yields(4, 4, {}) is None and yields(2, 8, {}) is None
    assert yields(4, 2, {emu.YIELD_MCA: "0"}) is None  # mpirun reads it from the environment itself


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
    monkeypatch.setenv(emu.ENV_INSTANCE, "")  # recorded, so that what main() sets is undone afterwards
    monkeypatch.delenv(emu.ENV_INSTANCE)
    monkeypatch.setenv(emu.ENV_STATE_DIR, "/nonexistent-granndis")
    assert emu.main(["--instance", "slurm", "status"]) == emu.EXIT_USAGE  # no cluster set up there
    assert os.environ[emu.ENV_INSTANCE] == "slurm"
    assert emu.main(["--instance", "emu", "status"]) == emu.EXIT_USAGE
    assert "not 'emu'" in capsys.readouterr().err
