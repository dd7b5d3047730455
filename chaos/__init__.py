"""ray-chaos-harness: chaos testing for real Ray clusters.

Kept import-light on purpose: this file is in every Ray job's runtime_env (the recorder's
package, chaos.train.job_package), so importing it must not pull in pytest, paramiko or
matplotlib.  ``__version__`` is the one place the version is written (pyproject.toml reads it).
"""

__version__ = "0.1.0"
