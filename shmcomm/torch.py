"""torch.distributed backend "shmcomm" (registered by hand with ``import shmcomm.torch``)."""


def _autoload():
    """Entry point run inside ``import torch``: registers the backend, never raises."""
    import warnings

    try:
        _register()
    except Exception as exc:  # noqa: BLE001 - must never break `import torch`
        warnings.warn(f"shmcomm: torch backend not registered: {exc}", RuntimeWarning, stacklevel=2)


def _register():
    pass
