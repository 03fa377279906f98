"""The HTTP API (`dtask serve`): a thin FastAPI adapter over ``dtask.client``, JSON in the
shapes of the CLI's ``--json``, every request authenticated by a client's token."""
