"""`ppx plan`'s layer: the inputs of a plan (costs, bytes, budget), the space of candidate
schedules, their evaluation on the simulator and the memory model, the search and ranking,
and the files a plan writes. Above `report` (it reads run directories), below `launch`."""
