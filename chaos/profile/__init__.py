"""Profiles: one YAML file describing one target cluster (no profile = the embedded cluster).

A profile says how to reach Ray (dashboard, GCS), where checkpoints go, how to reach each
host (SSH settings with per-host overrides), which workload to run, the SLO and the retry
budget each fault kind should consume, and the safety limits.  ``models`` holds the fields
and their checks, ``loading`` reads YAML into them with ``FILE:LINE: FIELD: PROBLEM``
errors; docs/reference/profile.md lists every field.
"""

from chaos.profile.loading import dump_profile, embedded_profile, load_profile, parse_profile, profile_from_dict
from chaos.profile.models import Profile, ProfileInvalid, SafetySettings
from chaos.secrets import is_secret_name, secret_in_command

__all__ = ["Profile", "ProfileInvalid", "SafetySettings", "dump_profile", "embedded_profile", "is_secret_name",
           "load_profile", "parse_profile", "profile_from_dict", "secret_in_command"]
