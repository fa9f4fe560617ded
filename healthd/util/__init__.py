"""Plain helpers every part of healthd uses, none knowing of another part:

- durations, times: durations and timestamps as people and Kubernetes write them
- models, validation, bundled: files a person writes (frozen models, readable errors,
  files shipped in the package)
- logs: structured JSON logs
- http: /metrics, /healthz and /readyz for the daemons
- output, exits: `-o FORMAT` and exit statuses for every command
"""
