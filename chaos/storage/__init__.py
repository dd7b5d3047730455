"""Object storage for checkpoints: a real S3-compatible server, the fault proxy in front of
it, and what a run needs to reach it.

* ``server``: moto's S3 server (``moto_server``), started and stopped by PID on one address
  (loopback, or the test-host bridge's), for the clusters the harness runs itself.
* ``proxy``: an HTTP reverse proxy the S3 endpoint is reached through; it logs every request
  (the timeline's ``storage`` events: each checkpoint's upload start and end) and answers
  with errors or latency while a storage fault is armed, through an admin API.
* ``access``: what a job's environment gets so that pyarrow's S3 client reaches the endpoint
  with the credentials the profile names (never their values in the profile).
* ``local``: the server and the proxy together, as the embedded cluster and the
  no-shared-filesystem stand-in run them.
"""
