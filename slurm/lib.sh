# Shared helpers for slurm/*.sbatch (sourced, not run).  Everything a site may need to change is an
# environment variable; see slurm/README.md for the list.
# shellcheck shell=bash

granndis_die() {
    echo "granndis slurm: error: $*" >&2
    exit 2
}

granndis_note() {
    echo "granndis slurm: $*" >&2
}

granndis_is_uint() {
    [[ "$1" =~ ^[0-9]+$ ]]
}

# Site environment: modules (GRANNDIS_MODULES, space or comma separated), an arbitrary setup script
# (GRANNDIS_ENV_SCRIPT, e.g. conda activation) and a Python venv (GRANNDIS_VENV).  Batch shells are
# non-interactive, so the `module` function may be missing: try the usual init scripts first.
granndis_site_env() {
    if [ -n "${GRANNDIS_MODULES:-}" ]; then
        if ! type module >/dev/null 2>&1; then
            local init
            for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh "${MODULESHOME:-/nonexistent}/init/bash"; do
                # shellcheck disable=SC1090
                if [ -r "$init" ]; then . "$init"; break; fi
            done
        fi
        type module >/dev/null 2>&1 || \
            granndis_die "GRANNDIS_MODULES is set but there is no 'module' command on this node; set MODULESHOME or unset GRANNDIS_MODULES"
        local mod
        for mod in ${GRANNDIS_MODULES//,/ }; do
            module load "$mod" || granndis_die "'module load $mod' failed (check GRANNDIS_MODULES)"
        done
    fi
    if [ -n "${GRANNDIS_ENV_SCRIPT:-}" ]; then
        [ -r "$GRANNDIS_ENV_SCRIPT" ] || granndis_die "GRANNDIS_ENV_SCRIPT=$GRANNDIS_ENV_SCRIPT is not a readable file"
        # shellcheck disable=SC1090
        . "$GRANNDIS_ENV_SCRIPT"
    fi
    if [ -n "${GRANNDIS_VENV:-}" ]; then
        [ -r "$GRANNDIS_VENV/bin/activate" ] || \
            granndis_die "GRANNDIS_VENV=$GRANNDIS_VENV has no bin/activate (create it with 'python -m venv' first)"
        # shellcheck disable=SC1091
        . "$GRANNDIS_VENV/bin/activate"
    fi
}

# Job shape from Slurm: sets GRANNDIS_NNODES, GRANNDIS_NTASKS and GRANNDIS_TASKS_PER_NODE.
# SLURM_NTASKS_PER_NODE exists only when --ntasks-per-node was given; otherwise derive it, and refuse
# uneven layouts (every server must have the same number of ranks).
granndis_job_shape() {
    [ -n "${SLURM_JOB_ID:-}" ] || granndis_die "SLURM_JOB_ID is not set: submit this script with sbatch"
    local nnodes="${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-}}"
    granndis_is_uint "$nnodes" && [ "$nnodes" -gt 0 ] || \
        granndis_die "SLURM_NNODES='${nnodes}' is not a positive integer"
    local ntasks="${SLURM_NTASKS:-}" per_node="${SLURM_NTASKS_PER_NODE:-}"
    if [ -n "$per_node" ]; then
        granndis_is_uint "$per_node" && [ "$per_node" -gt 0 ] || \
            granndis_die "SLURM_NTASKS_PER_NODE='$per_node' is not a positive integer (use --ntasks-per-node=N)"
        [ -n "$ntasks" ] || ntasks=$((per_node * nnodes))
    fi
    granndis_is_uint "$ntasks" && [ "$ntasks" -gt 0 ] || \
        granndis_die "SLURM_NTASKS='${ntasks}' is not a positive integer (use --ntasks-per-node=N)"
    if [ -z "$per_node" ]; then
        [ $((ntasks % nnodes)) -eq 0 ] || \
            granndis_die "$ntasks tasks on $nnodes nodes is uneven; every server needs the same number of ranks: use --ntasks-per-node"
        per_node=$((ntasks / nnodes))
    fi
    [ "$ntasks" -eq $((per_node * nnodes)) ] || \
        granndis_die "SLURM_NTASKS=$ntasks but $nnodes nodes x $per_node tasks per node = $((per_node * nnodes)); every server needs the same number of ranks"
    GRANNDIS_NNODES=$nnodes
    GRANNDIS_NTASKS=$ntasks
    GRANNDIS_TASKS_PER_NODE=$per_node
}

# Whether the job was given GPUs: Slurm's GPU variables (counts: zero is none; index lists: any entry) or
# CUDA_VISIBLE_DEVICES (NoDevFiles and -1 hide every GPU).  The batch shell sees the job's allocation.
granndis_job_has_gpus() {
    local var value
    for var in SLURM_GPUS_ON_NODE SLURM_GPUS_PER_NODE SLURM_GPUS_PER_TASK SLURM_GPUS; do
        value="${!var:-}"
        # "a100:4" or "4" (several types: "a100:2,v100:2"); any count above zero
        if [[ "$value" =~ (^|[:,])0*[1-9][0-9]*($|,) ]]; then return 0; fi
    done
    for var in SLURM_JOB_GPUS SLURM_STEP_GPUS CUDA_VISIBLE_DEVICES; do
        value="${!var:-}"
        case "${value,,}" in ""|-1|none|nodevfiles|void) ;; *) return 0 ;; esac
    done
    return 1
}

# Fill the array LAUNCH with the parallel launcher for GRANNDIS_NTASKS ranks, GRANNDIS_TASKS_PER_NODE
# per node, in block order (ranks 0..n-1 on the first node, ...), which is what ranks-per-server means.
#   GRANNDIS_LAUNCHER=srun (default) | mpirun ; GRANNDIS_SRUN_MPI=pmix (srun's --mpi plugin)
#   GRANNDIS_GPU_BIND (srun --gpu-bind value; empty by default, see README) ; GRANNDIS_LAUNCHER_ARGS (extra words)
granndis_launcher() {
    local cpus="${SLURM_CPUS_PER_TASK:-}"
    case "${GRANNDIS_LAUNCHER:-srun}" in
        srun)
            LAUNCH=(srun "--mpi=${GRANNDIS_SRUN_MPI:-pmix}" "--nodes=$GRANNDIS_NNODES" "--ntasks=$GRANNDIS_NTASKS"
                    "--ntasks-per-node=$GRANNDIS_TASKS_PER_NODE" --distribution=block:block --kill-on-bad-exit=1)
            # Since Slurm 22.05 srun does not inherit --cpus-per-task from sbatch: pass it on.
            [ -n "$cpus" ] && LAUNCH+=("--cpus-per-task=$cpus")
            [ -n "${GRANNDIS_GPU_BIND:-}" ] && LAUNCH+=("--gpu-bind=$GRANNDIS_GPU_BIND")
            ;;
        mpirun)
            # ppr:N:node places N consecutive ranks per node (block order); with PE=c each rank gets c cores.
            local map="ppr:$GRANNDIS_TASKS_PER_NODE:node" bind=none
            if [ -n "$cpus" ]; then map="$map:PE=$cpus"; bind=core; fi
            LAUNCH=(mpirun -n "$GRANNDIS_NTASKS" --map-by "$map" --bind-to "$bind")
            # Open MPI starts remote ranks through Slurm but passes on only the variables named here.
            local var
            for var in PATH LD_LIBRARY_PATH PYTHONPATH VIRTUAL_ENV OMP_NUM_THREADS \
                       $(compgen -e | grep -E '^(GRANNDIS_|NCCL_|CUDA_|UCX_|OMPI_MCA_)' || true); do
                [ -n "${!var+x}" ] && LAUNCH+=(-x "$var")
            done
            ;;
        *)
            granndis_die "GRANNDIS_LAUNCHER='${GRANNDIS_LAUNCHER}' is not supported: use srun or mpirun"
            ;;
    esac
    if [ -n "${GRANNDIS_LAUNCHER_ARGS:-}" ]; then
        local extra
        read -r -a extra <<<"$GRANNDIS_LAUNCHER_ARGS"
        LAUNCH+=("${extra[@]}")
    fi
}

# Log a command as one copy-pasteable line.
granndis_show() {
    local out="" word
    for word in "$@"; do out+="$(printf '%q' "$word") "; done
    granndis_note "running: ${out% }"
}

# Run a command in the background and wait for it, passing USR1 and TERM on to it as USR1.  Slurm's
# --signal=B:USR1@T and `scancel --signal=TERM --batch` signal only this batch shell.  Sets
# GRANNDIS_SIGNAL to the last signal received.
granndis_forward_signal() {
    GRANNDIS_SIGNAL=$1
    # SIGUSR1 whatever arrived: both launchers relay it to every rank untouched, and the ranks treat it
    # as they treat SIGTERM (checkpoint, stop).  SIGTERM itself would not reach them alive: Slurm
    # 22.05's srun answers it by killing the step ("srun: forcing job termination", every rank
    # SIGKILLed, no checkpoint; measured), and Open MPI 4.1's mpirun tears the job down about a second
    # after forwarding it.
    local left=""
    # how early the time-limit warning came (Slurm checks limits periodically: it may be a minute early)
    [ -n "${SLURM_JOB_ID:-}" ] && left="$(timeout 5 squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null || true)"
    granndis_note "got SIG$1 at $(date -u +%H:%M:%S) UTC${left:+ (time left: $left)}, passing SIGUSR1 to the ranks"
    # srun drops a signal that comes before it has started the tasks (measured): the stop file, which
    # the ranks poll as they poll the signal flag (engine/signals.py), still asks them once they run.
    # Rank 0 runs on this node (block placement), and one rank asking stops them all.
    if [ -n "${GRANNDIS_STOP_FILE:-}" ]; then : >"$GRANNDIS_STOP_FILE" 2>/dev/null || true; fi
    # A rank signalled in its first moments, before granndis-train has installed its handlers, dies of
    # it (measured: a warning at the launch second, relayed by srun, killed all four).  So a launcher
    # younger than GRANNDIS_SIGNAL_GRACE_S (15 s) gets the signal only when it is that old; the stop
    # file asks rank 0 meanwhile.
    if [ -n "${GRANNDIS_CHILD:-}" ]; then
        local age=$((SECONDS - ${GRANNDIS_LAUNCHED_AT:-0})) grace="${GRANNDIS_SIGNAL_GRACE_S:-15}"
        if [ "$age" -ge "$grace" ]; then
            kill -USR1 "$GRANNDIS_CHILD" 2>/dev/null || true
        else
            ( sleep $((grace - age)); kill -USR1 "$GRANNDIS_CHILD" 2>/dev/null || true ) &
        fi
    fi
}

granndis_run_forwarding_signals() {
    GRANNDIS_SIGNAL="${GRANNDIS_SIGNAL:-}"  # one caught before (train.sbatch's first traps) is kept
    GRANNDIS_CHILD=""
    # Traps first, so a signal that arrives while the launcher starts is not lost.
    trap 'granndis_forward_signal USR1' USR1
    trap 'granndis_forward_signal TERM' TERM
    # The launcher's stderr also goes to a file, to explain a failure afterwards (granndis_explain_failure),
    # through a tee that ignores the stop signals (a plain scancel signals this whole batch step: a dead
    # tee would kill the launcher with SIGPIPE at its next message).
    local tmp
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/granndis-launch.XXXXXX")"
    GRANNDIS_LAUNCH_ERR="$tmp/stderr"
    export GRANNDIS_STOP_FILE="$tmp/stop"  # one per attempt: a new attempt never sees an old request
    mkfifo "$tmp/fifo"
    ( trap '' TERM USR1 INT HUP; exec tee "$GRANNDIS_LAUNCH_ERR" <"$tmp/fifo" >&2 ) &
    local tee_pid=$!
    GRANNDIS_LAUNCHED_AT=$SECONDS
    "$@" 2>"$tmp/fifo" &
    GRANNDIS_CHILD=$!
    if [ -n "$GRANNDIS_SIGNAL" ]; then granndis_forward_signal "$GRANNDIS_SIGNAL"; fi
    local rc again
    while :; do
        wait "$GRANNDIS_CHILD"
        rc=$?
        [ "$rc" -le 128 ] && break
        # Above 128: the launcher died of a signal, or a trap interrupted `wait`; then wait again.
        kill -0 "$GRANNDIS_CHILD" 2>/dev/null && continue
        wait "$GRANNDIS_CHILD" 2>/dev/null
        again=$?
        [ "$again" -ne 127 ] && rc=$again  # 127: its status was already collected above
        break
    done
    trap - USR1 TERM
    # tee ends when the last writer is gone; do not wait forever on a stray process holding the pipe
    local i
    for i in $(seq 50); do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.1; done
    kill "$tee_pid" 2>/dev/null || true
    wait "$tee_pid" 2>/dev/null || true
    rm -f "$tmp/fifo"
    return "$rc"
}

# After a failed launch: say what a known launcher failure means (the ranks' own messages are above it).
# granndis_cleanup_launch removes the saved stderr.
granndis_explain_failure() {
    local err="${GRANNDIS_LAUNCH_ERR:-}"
    [ -n "$err" ] && [ -r "$err" ] || return 0
    if grep -qE "not built with SLURM's PMI support|PMI2_Init failed|PMI_Init failed|pmi2 plugin|OPAL_ERR_NOT_SUPPORTED.*PMI" "$err"; then
        granndis_note "error: the MPI library cannot start under srun --mpi=${GRANNDIS_SRUN_MPI:-pmix} (it was not built for that PMI plugin).  Debian's and most Open MPI builds need --mpi=pmix: set GRANNDIS_SRUN_MPI=pmix (\`srun --mpi=list\` shows the site's plugins), or use GRANNDIS_LAUNCHER=mpirun"
    fi
}

granndis_cleanup_launch() {
    if [ -n "${GRANNDIS_LAUNCH_ERR:-}" ]; then rm -rf "$(dirname "$GRANNDIS_LAUNCH_ERR")"; fi
}

# The srun --mpi plugin must be one this Slurm has (`srun --mpi=list`), or srun fails with a long error.
granndis_check_mpi_plugin() {
    [ "${GRANNDIS_LAUNCHER:-srun}" = srun ] || return 0
    local want="${GRANNDIS_SRUN_MPI:-pmix}" list
    list="$(srun --mpi=list 2>&1)" || return 0  # an srun that cannot list: let srun itself decide
    grep -qE -- "^[[:space:]]+$want\$|available:.*\<$want\>" <<<"$list" || \
        granndis_die "GRANNDIS_SRUN_MPI=$want: this Slurm's srun has no '$want' MPI plugin (srun --mpi=list: $(tr '\n' ' ' <<<"$list")); set GRANNDIS_SRUN_MPI to one of them (pmix for Open MPI), or use GRANNDIS_LAUNCHER=mpirun"
}

# Is an option given among the words (`--name value` or `--name=value`)?
granndis_has_option() {
    local name=$1 word
    shift
    for word in "$@"; do
        [ "$word" = "$name" ] || [[ "$word" == "$name="* ]] && return 0
    done
    return 1
}

# Append `--name value` to the array named $1 unless the user's words ($4...) give --name themselves: the
# logged command line then shows each option once, with the value that is used.
granndis_default_option() {
    local -n _into=$1
    local name=$2 value=$3
    shift 3
    granndis_has_option "$name" "$@" || _into+=("$name" "$value")
}

# The epoch of RUN_DIR's newest complete checkpoint (COMPLETE.json is written last), -1 when none.
granndis_checkpoint_epoch() {
    local best=-1 done epoch
    for done in "$1"/checkpoints/epoch-*/COMPLETE.json; do
        [ -e "$done" ] || continue
        epoch="${done%/COMPLETE.json}"
        epoch=$((10#${epoch##*/epoch-}))
        [ "$epoch" -gt "$best" ] && best=$epoch
    done
    echo "$best"
}
