"""MCP face tests."""

# Every tool the server lists, in registration order (one list for every test that counts tools).
EXPECTED_TOOLS = [
    "run", "start_run", "get_run", "cancel_run", "pin_run", "list_runs", "replay_run", "fork_run", "inspect_trace",
    "list_volumes", "list_files", "read_file", "write_file", "doctor",
    "optimize", "list_programs", "promote_program", "chat", "approve", "conversations",
]  # fmt: skip
