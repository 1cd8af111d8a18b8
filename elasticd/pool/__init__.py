"""The elastic pool (seed 000): MEASURE (worker sensors), TRANSPORT (the channel), INTERPRET (the evaluator),
DECIDE (placement, admission, scale-up, compaction). The deciding modules are pure: data in, decision out."""
