"""ray-chaos-harness: chaos testing for real Ray clusters.

Kept import-light on purpose: this package is shipped into every Ray job's
runtime_env (the recorder lives here), so importing it must not pull in
pytest, paramiko or matplotlib.
"""

__version__ = "0.1.0"
