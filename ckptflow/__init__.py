"""ckptflow command-line entry point (dispatch only; features live in `steps` and `workflows`)."""
