"""The ``shmrun`` launcher (``python -m shmcomm.launch``), one concept per module.

``run.main`` parses the command line, then runs the job: one ``Supervisor`` per attempt starts
the ranks with their environment, shows their output, and stops them all when one fails::

    run.py           main(), launch(), run_job(): a whole job: signal handlers, log directory,
                     the link to other nodes, one supervised attempt after another (restarts)
    supervisor.py    Supervisor: one attempt: start the ranks, pump their output, watch exits,
                     blame the root cause, stop and sweep the process trees, remove segments
    cli.py           the command line -> LaunchConfig (torchrun's and mpirun's spellings too)
    limits.py        how many ranks may start: at most 4096, within ulimit -u and -n
    environment.py   job names, ports, CPU binding plan, OMP_NUM_THREADS, each rank's environment
    outcome.py       Rank, Outcome, shmrun's exit codes, the failure summary
    console.py       live output: [rank] prefixes, timestamps, whole lines, held partial lines
    logs.py          --log-dir: each rank's raw output in DIR/<run id>/attempt_<k>/rank<r>.out|.err
    process_tree.py  the ranks' process trees: subreaper, signalling groups, reaping orphans
    config.py        LaunchConfig: what one job is; PROG, the launcher's name
    error_file.py    how a rank tells its launcher why it failed (its own fault or a peer's)
    mpirun.py        what mpirun and mpiexec tell the ranks they start (rank, size, a job id)
    node_link.py     the authenticated link that stops every node's ranks when one node fails

Each module imports only modules below it in this list. The package itself imports nothing:
``import shmcomm`` loads only ``error_file`` (its excepthook) from here. ``sc.spawn``
(shmcomm/spawn.py) runs its ranks through ``run.run_job``. The CPU topology (``--bind-to``) is
``shmcomm.cpus``, shared with the composition levels.
"""
