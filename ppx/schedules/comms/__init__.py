"""Where the sends and receives of a compute order go: `lowering` (Megatron's placement),
`lockstep` (the dry run that places them for gloo) and `program` (one rank's list compiled to
the items the runtime executes). Imports only the rooms below it."""
