"""`endpointd sandbox check`: the escape-probe suite, the scene it plants, the run."""
