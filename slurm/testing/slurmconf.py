"""slurm.conf of the test cluster (pure; standard library only): see slurmcluster.py for why each line."""
from __future__ import annotations

CLUSTER_NAME = "granndis"
PARTITION = "emu"



def slurm_conf(state, sdir, cpus, cred_expire, kill_wait, munge_socket):
    h0 = state["hosts"][0]
    lines = [
        "# written by slurm/testing/slurmcluster.py: a test cluster on emulated servers",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={h0['hostname']}({h0['address']})",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket},cred_expire={int(cred_expire)}",
        f"StateSaveLocation={sdir}/ctld",
        f"SlurmctldPidFile={sdir}/slurmctld.pid",
        f"SlurmctldLogFile={sdir}/slurmctld.log",
        # %n: the node name; both slurmd share one file system
        f"SlurmdSpoolDir={sdir}/spool-%n",
        f"SlurmdPidFile={sdir}/slurmd-%n.pid",
        f"SlurmdLogFile={sdir}/slurmd-%n.log",
        f"TmpFS={sdir}/tmp-%n",
        "SlurmdParameters=config_overrides",  # declare more CPUs than the machine's cores
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "SchedulerType=sched/backfill", "ReturnToService=2",
        f"KillWait={int(kill_wait)}", "MinJobAge=3600", "InactiveLimit=0", "OverTimeLimit=0",
        "SlurmctldTimeout=30", "SlurmdTimeout=60", "MessageTimeout=20",
        "SlurmctldDebug=info", "SlurmdDebug=info",
    ]
    for h in state["hosts"]:
        lines.append(f"NodeName={h['hostname']} NodeAddr={h['address']} NodeHostname={h['hostname']} "
                     f"CPUs={int(cpus)} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes={','.join(h['hostname'] for h in state['hosts'])} "
                 f"Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"
