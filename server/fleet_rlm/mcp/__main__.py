"""``python -m fleet_rlm.mcp``: the same as the ``fleet-mcp`` console script."""

from fleet_rlm.mcp.server import main

raise SystemExit(main())
