"""The entry point torch runs inside ``import torch`` (entry-point group ``torch.backends``).

It lives apart from ``shmcomm.torch`` so that nothing shmcomm fails to import can surface as a
failed ``import torch``: torch turns any exception of an entry point into a RuntimeError.

Example (what torch does with it)::

    from shmcomm._torch_entry import autoload; autoload()
"""

from __future__ import annotations

import importlib
import warnings


def autoload() -> None:
    """Register the ``shmcomm`` torch.distributed backend; warn, never raise, if it cannot be.

    Example::

        autoload()   # then: torch.distributed.init_process_group("shmcomm")
    """
    try:
        # import_module returns the module even while it is half built (a user's
        # `import shmcomm.torch` runs `import torch`, which runs this): it registers at its end.
        importlib.import_module("shmcomm.torch")._autoload()
    except Exception as exc:  # noqa: BLE001 - must never break `import torch`
        warnings.warn(f"shmcomm: torch backend not registered: {exc}", RuntimeWarning, stacklevel=2)
