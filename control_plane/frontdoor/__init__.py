"""The front door: the machinery that decides whether, when and how a request is processed,
between the HTTP routes (api/, ui/) and the services.

- admission.py: the two lanes (the cluster's and the users'), their slots, queues and
  Retry-After; health answered from memory; `AdmissionControl`, the ASGI entry of every request.
- access_log.py: every request counted and logged around the front door (refusals included).
- limits.py: body limits enforced while reading (413), NUL in the URL (400).
- body_budget.py: large bodies spooled to disk within the caller's and the host's memory budgets.
- express.py, fastjson.py: the hot routes' fast paths (bodies parsed from bytes, orjson answers)
  and the express lane that serves them straight from the front door.
- group_commit.py with log_batches.py and metric_batches.py: requests written together, one
  transaction for those that arrive while the previous one is written.
- agent_polls.py, preempt_polls.py (per_master.py): the long-poll hubs, checked in batches.
- error_shape.py: the one JSON error body, which api/errors.py answers with too.

Routes (parse, authorize, call a service, serialize) stay in api/; a fast lane calls the same
service operation as its route's usual path (services/metrics.report_many, services/logs.post_many).

What it may import: services, master, auth, config, db, core, errors, telemetry, shipyard_common,
and the web framework (starlette, fastapi). Never control_plane.api or control_plane.ui (import
contracts in pyproject.toml): api imports the front door, not the other way round.
"""
