"""The ``kubernetes`` client with a time limit on every call.

The generated client sends a request without a timeout unless the call names
one (``_request_timeout``), and urllib3 then waits on a silent connection for
ever: an API server that stops answering mid-request (a node lost under its
load balancer, a half-open TCP connection) would hold the operator's
allocation pass, or the node agent's write, for good, with no error to retry
and nothing in the log. ``TimedApiClient`` gives every call that names none
``REQUEST_TIMEOUT_S``; a call that names its own (the watch's long poll) keeps it.
"""

from __future__ import annotations

from typing import Any

import kubernetes

REQUEST_TIMEOUT_S: tuple[float, float] = (10.0, 60.0)
"""(connect, read) seconds of a call that names no timeout: the read limit is on each
wait for bytes, not the whole answer (a LIST page of 500 objects is one answer; 60 s is
the API server's own ``--request-timeout``). urllib3 sends a GET, PUT or DELETE that
timed out again, up to three times: a server that stops answering fails a read after
at most four minutes, a PATCH or POST after one."""


class TimedApiClient(kubernetes.client.ApiClient):
    """``ApiClient`` whose calls time out after ``REQUEST_TIMEOUT_S`` unless they say."""

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = REQUEST_TIMEOUT_S
        return super().call_api(*args, **kwargs)
