"""Who is calling: roles, API tokens and OIDC tokens (decision 0008)."""
