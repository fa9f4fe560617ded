"""`healthd demo`: the real agents and controller on a simulated cluster, playing a
scenario (healthd.demo.scenario) and showing it as it happens."""
