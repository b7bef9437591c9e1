"""``.. command-help:: MODULE ARGS...``: the ``--help`` text of one of shmcomm's commands, taken
from the command itself at build time, so the pages cannot drift from the real flags.

Example (in a page)::

    .. command-help:: shmcomm.launch --help

runs ``python -m shmcomm.launch --help`` (80 columns) and shows its output as a literal block. A
command that fails or prints nothing is a build warning (an error under ``-W``).
"""

from __future__ import annotations

import os
import subprocess
import sys

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


class CommandHelp(SphinxDirective):
    required_arguments = 1
    optional_arguments = 20
    final_argument_whitespace = False
    option_spec = {"caption": directives.unchanged}

    def run(self):
        module, args = self.arguments[0], self.arguments[1:]
        env = dict(os.environ, COLUMNS="80", PYTHONPATH=os.pathsep.join(
            p for p in [self.config.command_help_pythonpath, os.environ.get("PYTHONPATH", "")] if p))
        argv = [sys.executable, "-m", module, *args]
        try:
            # Run from this directory: `python -m` puts its working directory first on sys.path,
            # and the checkout's (where Sphinx runs) may hold an uncompiled shmcomm (see conf.py).
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60,
                                  stdin=subprocess.DEVNULL, cwd=os.path.dirname(os.path.abspath(__file__)))
            text, ok = proc.stdout.rstrip(), proc.returncode == 0
            why = f"exit code {proc.returncode}: {proc.stderr.strip()[-500:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            text, ok, why = "", False, str(exc)
        if not ok or not text:
            logger.warning("command-help: %s failed (%s)", " ".join(argv[2:]), why,
                           location=self.get_location())
            return []
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        self.set_source_info(block)
        return [block]


def setup(app):
    app.add_config_value("command_help_pythonpath", "", "env")
    app.add_directive("command-help", CommandHelp)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
