"""Scripts that run a baseline runtime the way its users do, one run per process."""
