"""Running checks here, once: the engine of `healthd check`, which the agent's deep
diagnostic Jobs and `healthd record` use too.

- plans: a check key (`remapped`, `dcgm:3`) becomes a configured check with its deadline
- once: run planned checks on this machine and judge the node
- report: the results as tables for a person
- termination: the compact summary a diagnostic pod leaves for the agent
- command: the `healthd check` command line
"""
