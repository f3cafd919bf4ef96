"""What a run did besides its step times: the job's phases, training health, the measured batch, checkpoints and their resume, saved state, replicas, tensor dumps."""
