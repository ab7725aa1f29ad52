"""One rank at work: its stages, the executors (ppx's runtime and torch's), point-to-point
communication, the observers' rule and the timed training loop."""
