"""A local stack: `dtask up` (services, workers, beat, Flower as child processes) and
`make demo`."""
