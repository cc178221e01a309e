"""What a job may touch: the Sandbox, its policy, and confining a worker to it."""
