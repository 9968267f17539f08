"""Writes a copy of openapi.yaml whose top-level security requires the bearer token.

usage: python3 scripts/openapi_require_token.py IN OUT   (scripts/schemathesis.sh with ST_TOKEN)
The document says auth is optional (a server without --token needs none); a server with a
token requires it on every operation but /healthz, /readyz and the dashboard page (security: []).
"""
import sys
text = open(sys.argv[1]).read()
optional = "security:\n  - {}\n  - bearerAuth: []\n"
if optional not in text:
    sys.exit("schemathesis: openapi.yaml has no top-level optional bearer security to make required")
open(sys.argv[2], "w").write(text.replace(optional, "security:\n  - bearerAuth: []\n", 1))
