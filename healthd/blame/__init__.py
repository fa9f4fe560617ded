"""Network blame: which node do its peers fail to reach, on which network.

- judge: the pure judgement over a reachability matrix or its sparse rows
- networks: the agents' ping reports read from Nodes, judged network by network
  (the controller and `healthd status` share it)
- announce: the controller's activity: one Event and a gauge per blame episode
"""
