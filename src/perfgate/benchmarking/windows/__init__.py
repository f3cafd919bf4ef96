"""Window runs from plan to figures: the plan, the harnessed launch, what each launch yields and its corroboration, and runs perfgate did not launch, imported from their files."""
