"""What mpirun and mpiexec tell a rank (shmcomm/launcher/mpirun.py), and how the default group
reads it when RANK and WORLD_SIZE are not set (shmcomm.world.job_arguments). Real launches of
Open MPI and Intel MPI: tests/test_start_modes.py."""

from __future__ import annotations

import pytest

from shmcomm.launcher.mpirun import MpiLaunch, mpi_launch

OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "PMIX_NAMESPACE": "prterun-host-123@1"}
INTEL_MPI = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALNRANKS": "3",
             "I_MPI_HYDRA_UUID": "a22f0000-6341-77cc-5661-0600dd8c6053"}


def test_each_launchers_variables():
    assert mpi_launch(OPEN_MPI) == MpiLaunch("Open MPI", 1, 4, 4, "mpi-prterun-host-123-1")
    assert mpi_launch(INTEL_MPI) == MpiLaunch("Hydra (MPICH, Intel MPI)", 2, 3, 3,
                                              "mpi-a22f0000-6341-77cc-5661-0600dd8c6053")
    assert mpi_launch({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "2", "MPIRUN_ID": "77"}) == \
        MpiLaunch("MVAPICH2", 0, 2, -1, "mpi-77")
    # MPICH's Hydra names no job: from a dict (not this process's environment) none is found
    assert mpi_launch({"PMI_RANK": "0", "PMI_SIZE": "2"}).job == ""
    assert mpi_launch({"RANK": "0", "WORLD_SIZE": "2"}) is None


def test_a_variable_that_is_not_a_number_is_named():
    with pytest.raises(ValueError, match=r"OMPI_COMM_WORLD_SIZE must be an integer \(set by the MPI launcher\), got 'x'"):
        mpi_launch(dict(OPEN_MPI, OMPI_COMM_WORLD_SIZE="x"))


def _clear(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SHMCOMM_JOB", "TORCHELASTIC_RUN_ID", "MASTER_PORT", "PMI_RANK",
                "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK",
                "MV2_COMM_WORLD_SIZE", "PMIX_NAMESPACE", "I_MPI_HYDRA_UUID"):
        monkeypatch.delenv(var, raising=False)


def test_the_default_group_takes_rank_size_and_job_from_mpirun(monkeypatch):
    from shmcomm.world import job_arguments

    _clear(monkeypatch)
    for var, value in OPEN_MPI.items():
        monkeypatch.setenv(var, value)
    assert job_arguments(None, None, None, 5.0) == (1, 4, "mpi-prterun-host-123-1", 5.0)
    monkeypatch.setenv("SHMCOMM_JOB", "mine")          # what the user set wins
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert job_arguments(None, None, None, 5.0) == (3, 4, "mine", 5.0)


def test_an_mpirun_job_across_nodes_or_without_a_name_is_refused_clearly(monkeypatch):
    from shmcomm.world import job_arguments

    _clear(monkeypatch)
    for var, value in dict(OPEN_MPI, OMPI_COMM_WORLD_LOCAL_SIZE="2").items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match="this Open MPI job has 4 ranks, 2 on this node: across nodes set SHMCOMM_LINK=mpi"):
        job_arguments(None, None, None, 5.0)
    # a rank and size passed in (SHMCOMM_LINK=mpi's, from MPI itself) may span nodes
    assert job_arguments(1, 4, "across", 5.0) == (1, 4, "across", 5.0)
    _clear(monkeypatch)
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "1")   # not under a Hydra proxy: no name to be found
    with pytest.raises(ValueError, match=r"mpirun names no job here: pass name=, or set SHMCOMM_JOB"):
        job_arguments(None, None, None, 5.0)


def test_without_any_launcher_the_message_names_them(monkeypatch):
    from shmcomm.world import job_arguments

    _clear(monkeypatch)
    with pytest.raises(ValueError, match="RANK is not set: pass it as an argument or run under shmrun, torchrun or mpirun"):
        job_arguments(None, None, None, 5.0)
