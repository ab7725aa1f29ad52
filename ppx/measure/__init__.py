"""What a run measures and is held against: timers, memory counters, profiler labels, clock
alignment, spans, bubble metrics, theory and the simulator's prediction."""
