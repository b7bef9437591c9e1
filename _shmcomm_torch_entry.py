"""Names the ``shmcomm`` torch.distributed backend; shmcomm itself is imported on first use.

torch runs every ``torch.backends`` entry point inside ``import torch``, in every program that
imports torch, whether or not it ever uses shmcomm. So this entry point lives outside the
``shmcomm`` package (importing ``shmcomm.anything`` runs ``shmcomm/__init__.py``, which loads the
compiled core and gives the process a ``SHMCOMM_SECRET``): it imports nothing of shmcomm, changes
no environment variable, and registers a creator that imports ``shmcomm.torch`` when a group of
the backend is made. A shmcomm that fails to import then fails ``init_process_group("shmcomm")``
with its own message, never ``import torch``.

Example (what ``import torch`` does with it)::

    import _shmcomm_torch_entry; _shmcomm_torch_entry.autoload()
    torch.distributed.init_process_group("shmcomm")    # imports shmcomm.torch, then makes the group
"""

from __future__ import annotations

BACKEND_NAME = "shmcomm"


def autoload() -> None:
    """The ``torch.backends`` entry point: register the backend; warn, never raise.

    Example::

        autoload()   # then: torch.distributed.init_process_group("shmcomm")
    """
    try:
        import torch.distributed as dist

        if dist.is_available():  # a torch built without it: nothing to register, nothing to say
            register()
    except Exception as exc:  # noqa: BLE001 - torch turns an entry point's error into a failed import
        import warnings

        warnings.warn(f"shmcomm: torch backend not registered: {exc}", RuntimeWarning, stacklevel=2)


def register() -> None:
    """Register "shmcomm" with ``torch.distributed`` for CPU tensors, once (the one place that
    does: ``shmcomm.torch.register`` is this function).

    Example::

        register(); register()                     # idempotent
        torch.distributed.init_process_group("shmcomm")
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed")
    if BACKEND_NAME in dist.Backend.backend_list and BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
    _register_rendezvous()


def _register_rendezvous() -> None:
    """``init_method="shmcomm://"``: ranks meet on this machine without an address or a port
    (``shmcomm.torch_rendezvous``), as under mpirun, where torch's ``env://`` finds no RANK."""
    from torch.distributed.rendezvous import register_rendezvous_handler

    try:
        register_rendezvous_handler(BACKEND_NAME, _rendezvous)
    except RuntimeError:
        pass  # registered already (by an older copy of this function): keep it
    except Exception as exc:  # noqa: BLE001 - a torch without the hook: the backend still works
        import warnings

        warnings.warn(f"shmcomm: init_method='shmcomm://' not available: {exc}", RuntimeWarning, stacklevel=2)


def _rendezvous(url: str, **kwargs):
    """The ``shmcomm://`` handler torch calls: ``shmcomm.torch_rendezvous`` does the work."""
    from shmcomm.torch_rendezvous import rendezvous

    return rendezvous(url, **kwargs)


# The oldest torch the backend was tested with (bench/torch_versions.py). torch 2.6 and older
# hang in DDP's first collective (they do not keep a Python Work alive while C++ waits on it).
OLDEST_TORCH = (2, 7)


def check_torch_version(version: str) -> None:
    """Raise ``RuntimeError`` naming the problem when torch ``version`` is older than the
    backend supports (``OLDEST_TORCH``); a newer one is let through.

    Example::

        check_torch_version("2.13.0+cpu")   # fine
        check_torch_version("2.5.1")        # RuntimeError: ... needs torch >= 2.7 ...
    """
    parts = version.split("+")[0].split(".")
    try:
        found = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return  # a version string of an unknown form (a source build): not ours to judge
    if found < OLDEST_TORCH:
        oldest = ".".join(map(str, OLDEST_TORCH))
        raise RuntimeError(f"shmcomm's torch backend needs torch >= {oldest}, found torch {version}: "
                           f"upgrade torch (pip install 'torch>={oldest}'), or call shmcomm's own "
                           f"collectives (shmcomm.all_reduce, ...), which take CPU tensors directly")


def _create(*args):
    """The creator torch calls for each group of the backend: ``shmcomm.torch`` makes it."""
    import torch

    check_torch_version(torch.__version__)
    from shmcomm.torch import _create

    return _create(*args)
