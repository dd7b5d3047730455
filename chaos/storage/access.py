"""What a run needs to reach its S3 storage, as a user sets it: the standard AWS environment
variables in the job's runtime_env, which pyarrow's S3 client (the AWS C++ SDK, pyarrow 26)
reads on every node — ``AWS_ENDPOINT_URL_S3`` (the endpoint), ``AWS_DEFAULT_REGION`` /
``AWS_REGION``, and the credentials the profile names by reference.

Credentials ``from: env`` travel as values in the job's runtime_env (whoever can read the
cluster's job table sees them, as with any runtime_env); ``aws_profile`` and ``nodes`` pass
no secret at all.  Where the credentials are given, the SDK is told not to ask the instance
metadata service (``AWS_EC2_METADATA_DISABLED``): it has nothing to find there, and the
harness's clusters never send traffic to an address outside loopback and their bridge.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from typing import Mapping

from chaos.errors import ProfileError
from chaos.profile.models import StorageSettings


@dataclasses.dataclass(frozen=True)
class ObjectStorage:
    """An ``s3://`` storage path and how the nodes reach it; ``environ``: where ``from: env``
    credentials are read (the harness's environment; the embedded server's own, made up)."""

    settings: StorageSettings
    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: os.environ)

    def __post_init__(self):
        if not self.settings.path.startswith("s3://"):
            raise ProfileError(f"storage path {self.settings.path} is not an s3:// URI")

    @property
    def path(self) -> str:
        return self.settings.path

    @property
    def s3(self):
        from chaos.profile.models import S3Settings

        return self.settings.s3 or S3Settings()

    def job_env(self) -> dict[str, str]:
        """The job's environment variables for this storage (the credentials' values read now)."""
        s3, env = self.s3, {}
        if s3.endpoint_url:
            env["AWS_ENDPOINT_URL_S3"] = s3.endpoint_url
        if s3.region:
            env["AWS_DEFAULT_REGION"] = env["AWS_REGION"] = s3.region
        creds = s3.credentials
        if creds.source == "env":
            missing = [n for n in creds.env if not self.environ.get(n)]
            if missing:
                raise ProfileError(f"storage.s3.credentials.env names {', '.join(missing)}, which "
                                   f"{'is' if len(missing) == 1 else 'are'} not set in the harness's environment: "
                                   "export them before the session (the job gets their values)")
            env.update({n: self.environ[n] for n in creds.env})
        elif creds.source == "aws_profile":
            env["AWS_PROFILE"] = creds.aws_profile
            if creds.credentials_file:
                env["AWS_SHARED_CREDENTIALS_FILE"] = creds.credentials_file
        if creds.source != "nodes":
            env["AWS_EC2_METADATA_DISABLED"] = "true"
        return env

    def endpoints(self) -> list[str]:
        """The storage endpoints this storage names, the one the nodes use first: its
        ``endpoint_url`` (else AWS's regional endpoint) and the fault proxy's upstream."""
        s3 = self.s3
        named = s3.endpoints()
        return named if s3.endpoint_url else [f"https://s3.{s3.region or 'us-east-1'}.amazonaws.com", *named]

    def bucket_and_prefix(self) -> tuple[str, str]:
        u = urllib.parse.urlsplit(self.path)
        return u.netloc, u.path.strip("/")


def endpoint_address(url: str) -> tuple[str, int]:
    """(host, port) of an endpoint URL, the port from its scheme when it gives none."""
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port or (443 if u.scheme == "https" else 80)
